//! The few parts of the POSIX ustar format a Herald backup needs: regular
//! files with short names, written and read as streams. Any `tar` lists and
//! extracts what this writes (`tar tvf backup.tar`); reading takes what GNU
//! and BSD tar write for such files, and refuses links, devices and
//! extended headers with a clear error instead of guessing.
//!
//! Written here rather than taken from the `tar` crate: it is not in
//! Cargo.lock, and a backup needs about a hundred lines of the format.

use anyhow::{bail, ensure, Context};
use std::io::{self, Read, Write};

const BLOCK: usize = 512;
/// The largest size the 11 octal digits of a ustar header hold (8 GiB);
/// beyond it the size is written base-256, as GNU tar does.
const MAX_OCTAL: u64 = 0o77777777777;

/// Writes regular files into a tar stream.
pub struct TarWriter<W: Write> {
    out: W,
}

impl<W: Write> TarWriter<W> {
    pub fn new(out: W) -> Self {
        Self { out }
    }

    /// Appends `name` (at most 100 bytes, relative, no `..`) with exactly
    /// `size` bytes read from `data`, mode 0600, modified at `mtime`
    /// (seconds since the epoch).
    pub fn append(&mut self, name: &str, size: u64, mtime: u64, data: impl Read) -> io::Result<()> {
        check_name(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.out.write_all(&header(name, size, mtime))?;
        let copied = io::copy(&mut data.take(size), &mut self.out)?;
        if copied != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{name}: {copied} bytes where {size} were expected"),
            ));
        }
        self.out.write_all(&[0; BLOCK][..padding(size)])
    }

    /// Writes the end of the archive (two empty blocks) and hands the
    /// stream back.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(&[0; 2 * BLOCK])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

fn padding(size: u64) -> usize {
    (BLOCK - (size % BLOCK as u64) as usize) % BLOCK
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 100
        || name.starts_with('/')
        || name
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err(format!(
            "{name:?} is not a relative path of at most 100 bytes"
        ));
    }
    Ok(())
}

fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
}

fn header(name: &str, size: u64, mtime: u64) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], 0o600);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    if size <= MAX_OCTAL {
        octal(&mut h[124..136], size);
    } else {
        h[124] = 0x80;
        h[128..136].copy_from_slice(&size.to_be_bytes());
    }
    octal(&mut h[136..148], mtime.min(MAX_OCTAL));
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

/// Parses a numeric field: octal digits (space or NUL padded), or GNU's
/// base-256 with the high bit set.
fn number(field: &[u8]) -> anyhow::Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        ensure!(field.len() >= 8, "base-256 field too short");
        ensure!(
            field[1..field.len() - 8].iter().all(|b| *b == 0) && field[0] == 0x80,
            "base-256 number out of range"
        );
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&field[field.len() - 8..]);
        return Ok(u64::from_be_bytes(bytes));
    }
    let text = std::str::from_utf8(field).context("numeric field is not text")?;
    let digits = text.trim_matches(|c| c == ' ' || c == '\0');
    if digits.is_empty() {
        return Ok(0);
    }
    // Digits only: `from_str_radix` alone would take a sign.
    ensure!(
        digits.bytes().all(|b| (b'0'..=b'7').contains(&b)),
        "bad octal number {digits:?}"
    );
    u64::from_str_radix(digits, 8).with_context(|| format!("bad octal number {digits:?}"))
}

fn text(field: &[u8]) -> anyhow::Result<&str> {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    std::str::from_utf8(&field[..end]).context("a name in the archive is not UTF-8")
}

/// Reads `r` to the end of the archive, calling `file` with each regular
/// file's name, size and contents (a reader of exactly that many bytes;
/// what `file` leaves unread is skipped). Directory entries are skipped;
/// any other kind of entry is an error.
pub fn read_files<R: Read>(
    mut r: R,
    mut file: impl FnMut(&str, u64, &mut dyn Read) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut h = [0u8; BLOCK];
    loop {
        r.read_exact(&mut h)
            .context("the archive ends before its end marker (truncated?)")?;
        if h.iter().all(|b| *b == 0) {
            return Ok(());
        }
        ensure!(
            &h[257..262] == b"ustar",
            "not a tar archive (no ustar header where one was expected)"
        );
        let stored = number(&h[148..156])?;
        let mut blank = h;
        blank[148..156].fill(b' ');
        let sum: u64 = blank.iter().map(|b| u64::from(*b)).sum();
        ensure!(
            sum == stored,
            "a tar header's checksum does not match (corrupted archive)"
        );
        let (prefix, name) = (text(&h[345..500])?, text(&h[..100])?);
        let name = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        // `tar -C dir -cf backup.tar .` names its entries ./…
        let name = name.trim_start_matches("./");
        let size = number(&h[124..136])?;
        let mut data = (&mut r).take(size);
        match h[156] {
            b'0' | 0 => {
                check_name(name).map_err(anyhow::Error::msg)?;
                file(name, size, &mut data)?;
            }
            b'5' => {}
            kind => bail!(
                "{name}: entries of type {:?} are not part of a Herald backup",
                char::from(kind)
            ),
        }
        io::copy(&mut data, &mut io::sink())?;
        ensure!(data.limit() == 0, "{name}: the archive ends inside it");
        let mut pad = [0u8; BLOCK];
        r.read_exact(&mut pad[..padding(size)])
            .context("the archive ends inside an entry's padding")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_numeric_field_is_octal_digits_and_nothing_else() {
        assert_eq!(number(b"0000644\0").unwrap(), 0o644);
        assert_eq!(number(b"   17 \0").unwrap(), 0o17);
        for bad in [&b"+17\0"[..], b"-1\0", b"18\0", b"1 7\0"] {
            assert!(number(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = TarWriter::new(Vec::new());
        for (name, data) in files {
            w.append(name, data.len() as u64, 1_700_000_000, *data)
                .unwrap();
        }
        w.finish().unwrap()
    }

    fn entries(bytes: &[u8]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        read_files(bytes, |name, size, data| {
            let mut buf = Vec::new();
            data.read_to_end(&mut buf)?;
            assert_eq!(buf.len() as u64, size);
            out.push((name.to_owned(), buf));
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn what_is_written_reads_back() {
        let big = vec![7u8; 3 * BLOCK + 1];
        let files: &[(&str, &[u8])] = &[("a.json", b"{}"), ("media/x", &big), ("empty", b"")];
        let got = entries(&archive(files)).unwrap();
        let want: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|(n, d)| (n.to_string(), d.to_vec()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn gnu_tar_reads_ours_and_we_read_gnu_tars() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("ours.tar");
        std::fs::write(
            &ours,
            archive(&[("herald.db", b"db"), ("media/ab", b"pic")]),
        )
        .unwrap();
        let out = Command::new("tar").arg("tvf").arg(&ours).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("-rw------- 0/0"), "{listing}");
        assert!(listing.contains("media/ab"), "{listing}");

        std::fs::create_dir_all(dir.path().join("src/media")).unwrap();
        std::fs::write(dir.path().join("src/herald.db"), b"database").unwrap();
        std::fs::write(dir.path().join("src/media/cd"), vec![1u8; 700]).unwrap();
        let theirs = dir.path().join("theirs.tar");
        let ok = Command::new("tar")
            .args(["--format=ustar", "-C"])
            .arg(dir.path().join("src"))
            .arg("-cf")
            .arg(&theirs)
            .args(["herald.db", "media"])
            .status()
            .unwrap();
        assert!(ok.success());
        let got = entries(&std::fs::read(&theirs).unwrap()).unwrap();
        assert_eq!(
            got,
            vec![
                ("herald.db".to_owned(), b"database".to_vec()),
                ("media/cd".to_owned(), vec![1u8; 700]),
            ]
        );
    }

    #[test]
    fn damaged_or_foreign_archives_are_refused() {
        let good = archive(&[("herald.db", b"db")]);
        let mut corrupt = good.clone();
        corrupt[3] ^= 1;
        let err = entries(&corrupt).unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
        let err = entries(&good[..BLOCK + 10]).unwrap_err().to_string();
        assert!(err.contains("ends"), "{err}");
        let err = entries(&[1u8; 2 * BLOCK]).unwrap_err().to_string();
        assert!(err.contains("not a tar archive"), "{err}");
        let mut link = header("evil", 0, 0);
        link[156] = b'2';
        link[148..156].fill(b' ');
        let sum: u32 = link.iter().map(|b| u32::from(*b)).sum();
        link[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        let mut bytes = link.to_vec();
        bytes.extend_from_slice(&[0; 2 * BLOCK]);
        let err = entries(&bytes).unwrap_err().to_string();
        assert!(err.contains("type '2'"), "{err}");
        for bad in ["../x", "/etc/passwd", "a//b", "media/./x"] {
            assert!(TarWriter::new(Vec::new())
                .append(bad, 0, 0, &b""[..])
                .is_err());
        }
    }

    #[test]
    fn sizes_past_8_gib_use_base_256() {
        let h = header("big", MAX_OCTAL + 1, 0);
        assert_eq!(number(&h[124..136]).unwrap(), MAX_OCTAL + 1);
        assert_eq!(number(&header("small", 1234, 0)[124..136]).unwrap(), 1234);
    }
}
