//! The simulated WhatsApp with transport faults on top, and the wire a
//! cut-off daemon's send may still be on.

use super::faults::FaultCtl;
use crate::domain::*;
use crate::ports::*;
use crate::simulator::Simulator;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The simulator, with transport faults on top of the ones it models.
pub(super) struct ChaosGateway {
    pub(super) sim: Arc<Simulator>,
    pub(super) ctl: Arc<FaultCtl>,
    pub(super) clock: Arc<dyn Clock>,
    /// Accounts unreachable until an instant (a dropped connection).
    pub(super) down: Arc<Mutex<HashMap<AccountId, DateTime<Utc>>>>,
    /// What reaches WhatsApp, shared by every daemon's gateway.
    pub(super) wire: Arc<Wire>,
}

impl ChaosGateway {
    pub(super) fn reachable(&self, account: &AccountId) -> Result<(), GatewayError> {
        let down = self.down.lock().expect("down map");
        match down.get(account) {
            Some(until) if *until > self.clock.now() => Err(GatewayError::Unreachable(
                "injected: connection dropped".into(),
            )),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl Gateway for ChaosGateway {
    async fn ready(&self, account: &AccountId) -> Result<(), GatewayError> {
        self.ctl.alive().await;
        self.reachable(account)
    }

    async fn upload(
        &self,
        account: &AccountId,
        media: &MediaId,
        mime: &str,
        bytes: Arc<[u8]>,
    ) -> Result<UploadHandle, GatewayError> {
        self.ctl.alive().await;
        self.reachable(account)?;
        if self.ctl.roll(0.05) {
            return Err(GatewayError::Transient("injected: upload reset".into()));
        }
        let out = self.sim.upload(account, media, mime, bytes).await;
        self.ctl.alive().await;
        out
    }

    async fn send(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
    ) -> Result<SendReceipt, GatewayError> {
        self.send_fenced(account, group, message, message_id, None)
            .await
    }

    async fn fetch_timelock(&self, account: &AccountId) -> Result<TimeLock, StandingError> {
        self.ctl.alive().await;
        self.reachable(account)
            .map_err(|e| StandingError::NotNow(e.to_string()))?;
        let out = self.sim.fetch_timelock(account).await;
        self.ctl.alive().await;
        if let Some(lock) = out.as_ref().ok().filter(|l| l.active) {
            self.wire.learned.lock().expect("learned").push((
                account.clone(),
                self.clock.now(),
                lock.until,
            ));
        }
        if self.wire.lock_end_hidden {
            return out.map(|l| TimeLock { until: None, ..l });
        }
        out
    }

    async fn claim_fence(&self, fence: &crate::domain::Fence) -> Result<(), GatewayError> {
        self.ctl.alive().await;
        self.reachable(&fence.account)?;
        let out = self.wire.claim(fence).await;
        self.ctl.alive().await;
        out
    }

    async fn send_fenced(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        fence: Option<&crate::domain::Fence>,
    ) -> Result<SendReceipt, GatewayError> {
        self.ctl.alive().await;
        self.reachable(account)?;
        self.wire
            .attempts
            .lock()
            .expect("attempts")
            .push((account.clone(), self.clock.now()));
        if self.ctl.roll(0.01) {
            return Err(GatewayError::Transient(
                "injected: reset before sending".into(),
            ));
        }
        if self.ctl.roll(0.003) {
            return Err(GatewayError::RateLimited {
                retry_after: Some(Duration::from_secs(20)),
            });
        }
        let lose_answer = self.ctl.roll(0.01);
        let out = match fence {
            None => {
                self.wire
                    .deliver(account, group, message, message_id, None)
                    .await
            }
            // Several daemons: a request that left before its daemon was
            // cut off arrives when the link is back, even if the daemon
            // gave up on it meanwhile (bytes sent are not taken back).
            // That late arrival is what fencing at WhatsApp is for.
            Some(f) => {
                if let Some(cut) = self.ctl.cut_at_next_send.lock().expect("cut").take() {
                    *self.ctl.stalled_until.lock().expect("stall") =
                        Some(tokio::time::Instant::now() + cut);
                }
                let (ctl, wire) = (self.ctl.clone(), self.wire.clone());
                let (account, group) = (account.clone(), group.clone());
                let (message, message_id, f) = (message.clone(), message_id.to_owned(), f.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(ON_THE_WIRE).await;
                    ctl.alive().await;
                    wire.deliver(&account, &group, &message, &message_id, Some(&f))
                        .await
                })
                .await
                .unwrap_or_else(|e| Err(GatewayError::Transient(format!("send task: {e}"))))
            }
        };
        tracing::debug!(target: "chaos", at = %self.clock.now(), %account, message_id, ok = out.is_ok(), lose_answer, "send");
        // A crash while the message was in flight: it may have arrived,
        // the answer never does.
        self.ctl.alive().await;
        if lose_answer && out.is_ok() {
            return Err(GatewayError::Transient("injected: answer lost".into()));
        }
        out
    }
}

/// How long a send is on the wire before WhatsApp has it (several daemons).
const ON_THE_WIRE: Duration = Duration::from_millis(40);

/// A daemon heard that an account's lock holds: (account, when, until).
pub(super) type Learned = (AccountId, DateTime<Utc>, Option<DateTime<Utc>>);

/// What reaches the simulated WhatsApp, and the check on it.
pub(super) struct Wire {
    pub(super) sim: Arc<Simulator>,
    /// Fences are dropped on the way in ([`Breakage::NoFencing`]).
    pub(super) unfenced: bool,
    /// The newest lease epoch that claimed or sent for each account,
    /// whatever WhatsApp checked.
    pub(super) claims: Mutex<HashMap<AccountId, i64>>,
    /// Sends accepted under an epoch older than one already claimed: a
    /// daemon that lost the account was heard after its new owner.
    pub(super) stale: Mutex<Vec<String>>,
    /// The lock's end is kept from the engine ([`Breakage::NoTimeLockEnd`]).
    pub(super) lock_end_hidden: bool,
    /// Every send a daemon made (account, when), for the time-lock check.
    pub(super) attempts: Mutex<Vec<(AccountId, DateTime<Utc>)>>,
    /// Each time a daemon heard from WhatsApp that a lock holds: (account,
    /// when, until).
    pub(super) learned: Mutex<Vec<Learned>>,
}

impl Wire {
    pub(super) async fn claim(&self, fence: &crate::domain::Fence) -> Result<(), GatewayError> {
        let out = if self.unfenced {
            Ok(())
        } else {
            self.sim.claim_fence(fence).await
        };
        if out.is_ok() {
            self.note_claim(fence);
        }
        out
    }

    /// Notes that `fence` claimed or sent for its account.
    pub(super) fn note_claim(&self, fence: &crate::domain::Fence) {
        let mut claims = self.claims.lock().expect("claims");
        let newest = claims.entry(fence.account.clone()).or_insert(fence.epoch);
        *newest = (*newest).max(fence.epoch);
    }

    pub(super) async fn deliver(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        fence: Option<&crate::domain::Fence>,
    ) -> Result<SendReceipt, GatewayError> {
        let newest = self.claims.lock().expect("claims").get(account).copied();
        let out = self
            .sim
            .send_fenced(
                account,
                group,
                message,
                message_id,
                fence.filter(|_| !self.unfenced),
            )
            .await;
        if let (Ok(_), Some(f)) = (&out, fence) {
            if let Some(n) = newest.filter(|n| *n > f.epoch) {
                self.stale.lock().expect("stale").push(format!(
                    "{account}: {} sent {message_id} under epoch {} after epoch {n} claimed the account",
                    f.node, f.epoch
                ));
            }
            self.note_claim(f);
        }
        out
    }
}

pub(super) struct OnlyChaos(pub(super) Arc<ChaosGateway>);

impl GatewayRegistry for OnlyChaos {
    fn gateway(&self, kind: GatewayKind) -> Option<Arc<dyn Gateway>> {
        (kind == GatewayKind::Simulator).then(|| self.0.clone() as Arc<dyn Gateway>)
    }
}
