//! The control port's generated bearer token: `<data_dir>/control.token`,
//! mode 0600, made on the first start when no token is configured. The
//! daemon uses it; the CLI on the same machine reads it from there, so
//! `herald …` works with no flags while other users and web pages cannot
//! drive the port.

use crate::settings::{Secret, Settings, TokenSource};
use anyhow::Context;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Every user token starts so, which tells it from the daemon's token at a
/// glance (and lets secret scanners find a leaked one).
pub const USER_TOKEN_PREFIX: &str = "hrld_";

/// What the store keeps of a user token.
pub fn token_hash(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// A new user token: the prefix and 256 random bits.
pub fn new_user_token() -> String {
    format!("{USER_TOKEN_PREFIX}{}", random_token())
}

pub const FILE_NAME: &str = "control.token";

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// The token the daemon enforces: the configured one, else the generated
/// one (created now if missing); `None` only when explicitly disabled.
pub fn for_daemon(settings: &Settings) -> anyhow::Result<Option<Secret>> {
    let source = settings.token_source()?;
    if settings.control.require_configured_token && !matches!(source, TokenSource::Configured(_)) {
        return Err(crate::settings::SettingsError {
            key: "control.token".into(),
            rule: "control.require_configured_token is on (as in the container image): give the \
                   token with HERALD_CONTROL__TOKEN or control.token_file (e.g. a secret mounted \
                   as a file); a generated token or \"none\" is refused"
                .into(),
        }
        .into());
    }
    Ok(match source {
        TokenSource::Configured(t) => Some(t),
        TokenSource::Generated => Some(load_or_create(&settings.storage.data_dir)?),
        TokenSource::Disabled => {
            tracing::warn!(
                "control.token = \"none\": /v1 accepts requests WITHOUT a token. Any local \
                 user or process can create reminders and make the paired numbers send. \
                 Remove the setting to get a generated token."
            );
            None
        }
    })
}

/// The token a client on this machine sends: `--token`, else the configured
/// one, else the generated file (readable by the daemon's user, and root).
pub fn for_client(settings: &Settings) -> Option<Secret> {
    match settings.token_source().ok()? {
        TokenSource::Configured(t) => Some(t),
        TokenSource::Generated => read(&settings.storage.data_dir),
        TokenSource::Disabled => None,
    }
}

/// The generated token, if the file exists and holds one.
pub fn read(data_dir: &Path) -> Option<Secret> {
    let text = std::fs::read_to_string(path(data_dir)).ok()?;
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| Secret::new(line))
}

/// Reads the generated token, or writes a new random one. The file is
/// written under a temporary name and renamed, so a crash never leaves a
/// half-written token; a file others can read is tightened to 0600.
pub fn load_or_create(data_dir: &Path) -> anyhow::Result<Secret> {
    let file = path(data_dir);
    if let Ok(meta) = std::fs::metadata(&file) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(path = %file.display(), "the token file was readable by others; setting it to 0600");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("restricting {}", file.display()))?;
        }
        if let Some(t) = read(data_dir) {
            return Ok(t);
        }
        tracing::warn!(path = %file.display(), "the token file is empty; generating a new token");
    }
    let token = Secret::new(random_token());
    write_private(&file, token.expose())?;
    tracing::info!(path = %file.display(), "generated the control port's bearer token");
    Ok(token)
}

/// Writes `line` as the whole of a new file readable by its owner only
/// (0600): under a temporary name beside it, synced, then renamed, so a
/// crash never leaves half a secret.
pub fn write_private(file: &Path, line: &str) -> anyhow::Result<()> {
    let tmp = beside(file, ".tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    writeln!(f, "{line}")
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("creating {}", file.display()))?;
    sync_dir_of(file)
}

/// The file beside `path` whose name is `path`'s with `suffix` appended
/// (`key` → `key.new`, `herald.db` → `herald.db-wal`): the one way every
/// temporary, companion and kept-aside file is named.
pub fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes the renames and removals of entries in `file`'s directory durable
/// (fsync of the directory): without it a crash can undo a rename the
/// file's contents already depend on.
pub fn sync_dir_of(file: &Path) -> anyhow::Result<()> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing the directory {}", dir.display()))
}

/// 256 random bits as hex.
pub fn random_token() -> String {
    use rand::RngExt;
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_that_requires_a_configured_token_refuses_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_str().unwrap();
        let load = |pairs: &[(&str, &str)]| {
            let mut env: std::collections::HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            env.insert("HERALD_STORAGE__DATA_DIR".into(), data.into());
            env.insert(
                "HERALD_CONTROL__REQUIRE_CONFIGURED_TOKEN".into(),
                "true".into(),
            );
            Settings::load_from(None, &env).unwrap()
        };
        for refused in [load(&[]), load(&[("HERALD_CONTROL__TOKEN", "none")])] {
            let err = format!("{:#}", for_daemon(&refused).unwrap_err());
            assert!(
                err.contains(
                    "invalid setting control.token: control.require_configured_token is on"
                ),
                "{err}"
            );
        }
        // Nothing was generated into the data directory.
        assert!(!path(dir.path()).exists());
        let file = dir.path().join("token");
        std::fs::write(&file, "from-a-secret-0a9b8c7d6e5f\n").unwrap();
        let s = load(&[("HERALD_CONTROL__TOKEN_FILE", file.to_str().unwrap())]);
        assert_eq!(
            for_daemon(&s).unwrap(),
            Some(Secret::new("from-a-secret-0a9b8c7d6e5f"))
        );
        let s = load(&[("HERALD_CONTROL__TOKEN", "from-the-env-0a9b8c7d6e5f4")]);
        assert_eq!(
            for_daemon(&s).unwrap(),
            Some(Secret::new("from-the-env-0a9b8c7d6e5f4"))
        );
    }

    /// Moved from `settings`' tests, which may not import this module.
    #[test]
    fn a_generated_token_passes_the_settings_rule() {
        let token = random_token();
        let env: std::collections::HashMap<String, String> =
            [("HERALD_CONTROL__TOKEN".to_owned(), token)].into();
        assert!(Settings::load_from(None, &env).is_ok());
    }

    #[test]
    fn generated_once_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        assert_eq!(a.expose().len(), 64);
        let mode = std::fs::metadata(path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(read(dir.path()).unwrap(), a);
    }

    #[test]
    fn an_empty_or_loose_file_is_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        std::fs::write(&file, "\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let t = load_or_create(dir.path()).unwrap();
        assert!(!t.is_empty());
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
