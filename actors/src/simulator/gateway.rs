//! The simulator as the engine's [`Gateway`]: each call checks the
//! account's session, then the group, the rate window and the message id,
//! in that order, as WhatsApp would answer them.

use super::*;

#[async_trait]
impl Gateway for Simulator {
    async fn upload(
        &self,
        account: &AccountId,
        media: &MediaId,
        _mime: &str,
        bytes: Arc<[u8]>,
    ) -> Result<UploadHandle, GatewayError> {
        let wait = {
            let now = self.clock.now();
            let Some(mut acc) = self.accounts.get_mut(account) else {
                return Err(GatewayError::LoggedOut);
            };
            acc.check_session(now)?;
            let transfer = self
                .config
                .upload_bytes_per_sec
                .map_or(Duration::ZERO, |bw| {
                    let nanos = bytes.len() as u128 * 1_000_000_000 / u128::from(bw.max(1));
                    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
                });
            transfer + acc.draw_latency(self.config.latency)
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        // The handle exists once the bytes are up; an upload abandoned
        // mid-transfer leaves nothing behind.
        let now = self.clock.now();
        let n = self.upload_seq.fetch_add(1, Ordering::Relaxed);
        let handle = UploadHandle {
            handle: format!("sim-upload-{n}-{}", &media.as_str()[..12]),
            expires_at: now + self.config.upload_ttl,
        };
        self.record(&JournalLine::Upload {
            account: account.clone(),
            handle: handle.handle.clone(),
            media: media.clone(),
            bytes: bytes.len() as u64,
            expires_at: handle.expires_at,
        });
        self.with_account(account, |a| {
            a.uploads.insert(
                handle.handle.clone(),
                Upload {
                    media: media.clone(),
                    expires_at: handle.expires_at,
                },
            );
            a.stats.uploads += 1;
            a.stats.upload_bytes += bytes.len() as u64;
        });
        Ok(handle)
    }

    /// The reach-out time-lock as WhatsApp's query answers it: active
    /// until its end while it holds (set by the risk model's 463, or by
    /// [`Simulator::time_lock`]). Simulated accounts have no new-chat
    /// quota (they send to groups only), so that query stays unsupported.
    async fn fetch_timelock(&self, account: &AccountId) -> Result<TimeLock, StandingError> {
        let now = self.clock.now();
        let Some(mut acc) = self.accounts.get_mut(account) else {
            return Err(StandingError::NotNow(
                "the account is not registered".into(),
            ));
        };
        acc.check_session(now)
            .map_err(|e| StandingError::NotNow(e.to_string()))?;
        let until = acc.timelock_until.filter(|u| now < *u);
        if until.is_none() {
            acc.timelock_until = None;
        }
        Ok(TimeLock {
            active: until.is_some(),
            until,
            kind: until.map(|_| "DEFAULT".to_owned()),
        })
    }

    /// The account's groups as one participating-groups query answers:
    /// groups it has left are not listed; admins-only groups are listed
    /// with `announce`, and whether this account is an admin of them.
    async fn list_groups(&self, account: &AccountId) -> Result<Vec<GroupInfo>, GatewayError> {
        let (answer, latency) = {
            let now = self.clock.now();
            let Some(mut acc) = self.accounts.get_mut(account) else {
                return Err(GatewayError::LoggedOut);
            };
            let latency = acc.draw_latency(self.config.latency);
            let answer = acc.check_session(now).map(|()| {
                let mut groups: Vec<GroupInfo> = acc
                    .groups
                    .iter()
                    .filter(|(_, access)| **access != GroupAccess::NotParticipant)
                    .map(|(jid, access)| GroupInfo {
                        jid: jid.clone(),
                        subject: Self::group_name(&acc, jid),
                        participants: sim_participants(jid),
                        announce: *access == GroupAccess::AdminsOnly,
                        is_admin: acc.admin_of.contains(jid),
                        community: None,
                    })
                    .collect();
                groups.sort_by(|a, b| a.jid.cmp(&b.jid));
                groups
            });
            (answer, latency)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        answer
    }

    async fn ready(&self, account: &AccountId) -> Result<(), GatewayError> {
        let wait = self.reconnect_wait(account);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }

    async fn typing(
        &self,
        account: &AccountId,
        group: &GroupJid,
        _for: Duration,
    ) -> Result<(), GatewayError> {
        let now = self.clock.now();
        let Some(mut acc) = self.accounts.get_mut(account) else {
            return Err(GatewayError::LoggedOut);
        };
        acc.check_session(now)?;
        acc.stats.typing += 1;
        acc.risk.typed(group.as_str(), now);
        Ok(())
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

    async fn claim_fence(&self, fence: &crate::domain::Fence) -> Result<(), GatewayError> {
        self.claim(fence)
    }

    async fn send_fenced(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        fence: Option<&crate::domain::Fence>,
    ) -> Result<SendReceipt, GatewayError> {
        // Written while the socket is down: the client holds it until the
        // socket is back.
        let held = self.reconnect_wait(account);
        if !held.is_zero() {
            tokio::time::sleep(held).await;
        }
        let (answer, latency) = self.decide_send(account, group, message, message_id, fence);
        // Accepted: the members have it, whether or not the answer makes
        // it back to the sender.
        if answer == Ok(SendReceipt { duplicate: false }) && message.amends().is_none() {
            self.hear(account, group, message, message_id);
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        answer
    }
}
