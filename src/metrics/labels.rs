//! The label sets of Herald's families: each bounded (see the module's
//! doc), so none can grow a series per run or per group.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::atomic::AtomicU64;

pub(super) type FloatGauge = Gauge<f64, AtomicU64>;
pub(super) type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AccountLabel {
    pub(super) account: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FailureLabels {
    pub(super) account: String,
    pub(super) reason: &'static str,
}

/// `signal` is one of `AccountSignal::label`'s few values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SignalLabels {
    pub(super) account: String,
    pub(super) signal: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabel {
    pub(super) kind: &'static str,
}

/// `kind`: `delivered` or `read`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReceiptLabels {
    pub(super) account: String,
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VersionLabel {
    pub(super) version: &'static str,
}

/// `status` is a final run status (`FINAL_STATUSES`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StatusLabels {
    pub(super) account: String,
    pub(super) status: &'static str,
}

/// `state` is one of `AccountState::NAMES`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabels {
    pub(super) account: String,
    pub(super) state: &'static str,
}

/// `node` is this daemon's cluster node id: one value per daemon.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LeaseLabels {
    pub(super) account: String,
    pub(super) node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}
