//! One run's delivery, executed inside its AccountActor's context, in four
//! named steps the actor (and the simulation) drive in turn:
//!
//! 1. [`begin`]: admit the run (load it and its account), take a fire
//!    permit, move it to `running` (compare-and-set: a run paused, stopped
//!    or finished meanwhile is not started) with its window end fixed,
//!    open its targets and rebuild the account's bucket, then announce it
//!    (forecast, window timer, event);
//! 2. [`RunCtx::prepare_uploads`]: upload each unique media once (or reuse a
//!    cached handle);
//! 3. [`RunCtx::deliver`]: up to `group_concurrency` groups in flight, each
//!    group's parts strictly in order, one token per message taken when
//!    the gateway is ready to write, a durable `sending` mark with a
//!    deterministic message id before every send;
//! 4. [`RunCtx::conclude`]: once its marks are durable, the run finishes,
//!    parks until its next window, or goes back to the account's queue.
//!
//! Every status change goes through [`crate::lifecycle::RunEvent`].
//!
//! Imports: `delivery` (the engine, bucket, caps and outcome of the run's
//! account actor), `domain`, `ports`, `messages`, `lifecycle`, and
//! `scheduling::preflight`.

mod begin;
mod conclude;
mod ctx;
mod failure;
mod plan;
mod send;
mod uploads;
mod window;

pub use begin::begin;
pub(crate) use begin::{claim_account, rebuild_bucket};
pub use ctx::{RunCtx, RunEnd};
pub use failure::backoff;
pub use plan::{account_caps, cap_policy, forecast_for, standing_note};
pub use window::{fixed_window_end, window_opening};

use crate::delivery::bucket::TokenBucket;
use crate::delivery::engine::{Engine, RunControl};
use crate::delivery::signals::Breaker;
use crate::domain::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// Runs all four steps.
pub async fn execute(
    engine: Arc<Engine>,
    account: AccountId,
    run_id: RunId,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    breaker: Rc<RefCell<Breaker>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
) -> RunEnd {
    let ctx = match begin(engine, account, run_id, control, bucket, breaker, uploads).await {
        Ok(ctx) => ctx,
        Err(end) => return end,
    };
    ctx.prepare_uploads().await;
    ctx.deliver().await;
    ctx.conclude().await.unwrap_or_else(|end| end)
}
