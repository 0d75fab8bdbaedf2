//! A clock that counts the time the machine spent suspended, for lease
//! deadlines (`herald_actors::delivery::leases`): Linux's `CLOCK_BOOTTIME`.
//! The monotonic clock `Instant` reads stops while a VM is paused or a
//! laptop sleeps; the database's clock, which decides when a lease ends,
//! does not.

use std::time::Duration;

/// Time since boot, suspended time included.
pub fn now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer given; it
    // is valid and exclusively borrowed for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(
        rc, 0,
        "CLOCK_BOOTTIME is available on every Linux since 2.6.39"
    );
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_moves_forward_with_real_time() {
        let a = super::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = super::now();
        assert!(b >= a + std::time::Duration::from_millis(20), "{a:?} {b:?}");
    }
}
