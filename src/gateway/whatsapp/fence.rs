//! Nothing goes on the wire for an account whose lease this daemon no
//! longer holds (several daemons on one database). The delivery engine
//! checks the lease before each part; that check and the moment the
//! stanza is written can be far apart (the client fetches device lists
//! and pre-keys first, and a daemon can be paused in between). So the
//! account's WebSocket transport itself asks again before every frame it
//! writes and before it connects: a daemon past its lease (by the
//! suspend-counting clock too) writes nothing more and closes its socket,
//! and cannot reconnect and push the new owner's connection off.

use herald_actors::delivery::leases::LeaseTable;
use herald_actors::domain::AccountId;
use herald_actors::ports::GatewayError;
use std::sync::Arc;
use whatsapp_rust::bytes::Bytes;
use whatsapp_rust::transport::Transport;

/// Asks the lease table whether the account may still be written for.
#[derive(Clone)]
pub struct WireGuard {
    account: AccountId,
    /// Set when the daemon shares the database with others; unset (one
    /// daemon), everything may be written.
    leases: Option<Arc<LeaseTable>>,
}

impl WireGuard {
    pub fn new(account: AccountId, leases: Option<Arc<LeaseTable>>) -> Self {
        Self { account, leases }
    }

    /// No leases: one daemon, always allowed.
    pub fn unfenced(account: AccountId) -> Self {
        Self::new(account, None)
    }

    /// The lease is held with at least its safety margin left.
    pub fn may_write(&self) -> bool {
        self.leases
            .as_ref()
            .is_none_or(|t| t.fence(&self.account).is_some())
    }

    fn why(&self) -> String {
        let node = self.leases.as_ref().map_or("", |t| t.node());
        format!(
            "daemon {node} no longer holds the lease of account {} with its safety margin left; \
             nothing more is written on its WhatsApp connection",
            self.account
        )
    }

    /// `Ok` while the account may be written for.
    pub fn check(&self) -> Result<(), GatewayError> {
        if self.may_write() {
            Ok(())
        } else {
            Err(GatewayError::LeaseEnded(self.why()))
        }
    }
}

/// The account's transport, asking its guard before each frame.
pub struct FencedTransport {
    pub inner: Arc<dyn Transport>,
    pub guard: WireGuard,
}

#[async_trait::async_trait]
impl Transport for FencedTransport {
    async fn send(&self, data: Bytes) -> Result<(), whatsapp_rust::anyhow::Error> {
        if !self.guard.may_write() {
            self.inner.disconnect().await;
            return Err(whatsapp_rust::anyhow::anyhow!(self.guard.why()));
        }
        self.inner.send(data).await
    }

    async fn disconnect(&self) {
        self.inner.disconnect().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    #[derive(Default)]
    struct Wire {
        written: Mutex<Vec<Bytes>>,
        closed: Mutex<bool>,
    }

    #[async_trait::async_trait]
    impl Transport for Wire {
        async fn send(&self, data: Bytes) -> Result<(), whatsapp_rust::anyhow::Error> {
            self.written.lock().unwrap().push(data);
            Ok(())
        }
        async fn disconnect(&self) {
            *self.closed.lock().unwrap() = true;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn frames_stop_at_the_lease_deadline_and_the_socket_closes() {
        let account = AccountId::parse("wa-1").unwrap();
        let table = Arc::new(LeaseTable::new("n1"));
        let wire = Arc::new(Wire::default());
        let t = FencedTransport {
            inner: wire.clone(),
            guard: WireGuard::new(account.clone(), Some(table.clone())),
        };
        // Not held at all: nothing is written.
        assert!(t.send(Bytes::from_static(b"a")).await.is_err());
        assert!(*wire.closed.lock().unwrap());
        *wire.closed.lock().unwrap() = false;
        let ttl = Duration::from_secs(10);
        table.hold(
            &account,
            3,
            tokio::time::Instant::now(),
            ttl,
            Duration::from_secs(2),
        );
        t.send(Bytes::from_static(b"b")).await.unwrap();
        tokio::time::advance(Duration::from_millis(7_999)).await;
        t.send(Bytes::from_static(b"c")).await.unwrap();
        // The safety margin reached: the next frame is refused, naming why.
        tokio::time::advance(Duration::from_millis(1)).await;
        let e = t
            .send(Bytes::from_static(b"d"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no longer holds the lease of account wa-1"),
            "{e}"
        );
        assert_eq!(*wire.written.lock().unwrap(), [&b"b"[..], b"c"]);
        assert!(*wire.closed.lock().unwrap());
        assert!(matches!(t.guard.check(), Err(GatewayError::LeaseEnded(_))));
        // One daemon (no leases): always written.
        assert!(WireGuard::unfenced(account).check().is_ok());
    }
}
