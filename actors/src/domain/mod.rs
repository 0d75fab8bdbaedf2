//! Herald's domain: newtypes that are valid by construction, and the records
//! the engine, the scheduler and the control port pass around.
//!
//! Every `parse` refuses bad input with a [`ValidationError`] naming the
//! field and the rule, so the control port can answer with exactly that.
//!
//! Imports: nothing. Every other module of both crates builds on these types.

mod amend;
mod error;
mod groups;
mod hash;
mod ids;
mod lease;
mod part;
mod polls;
mod receipts;
mod records;
mod reminder;
mod schedule;
mod schema;
mod selector;
mod standing;
mod template;
mod users;
mod webhooks;
mod window;
mod words;

pub use amend::{
    edits_for, polls_left, AmendKind, AmendProgress, AmendState, AmendTarget, AmendWindows,
    Amendment, NewAmendment, EDIT_WINDOW, RECALL_WINDOW,
};
pub use error::ValidationError;
pub use groups::{
    fold_name, parse_labels, Group, GroupFilter, GroupInfo, GroupPage, GroupSyncSummary, Label,
    MAX_LABELS,
};
pub use hash::{fnv64, SeededRng};
pub use ids::{AccountId, GroupJid, MediaId, RunId, TimeZone};
pub use lease::{Fence, Lease, LeaseLost, NodeInfo};
pub use part::{
    MessagePart, PartKind, MAX_CAPTION_CHARS, MAX_POLL_OPTIONS, MAX_POLL_OPTION_CHARS,
    MAX_POLL_QUESTION_CHARS, MAX_TEXT_CHARS, MIN_POLL_OPTIONS,
};
pub use polls::{
    choices_of, latest_votes, option_hash, voter_choice, voter_token, GroupPoll, OptionVotes,
    PollCounts, PollMessage, PollResult, PollSent, RunPoll, Vote, VoteIgnored, VoteTally,
    VoterChoice,
};
pub use receipts::{
    participant_of, receipt_key, Receipt, ReceiptKind, ReceiptTally, RunReceipts, SeenSet,
    TargetReceipts, TargetTally, RECEIPT_ID_LEN,
};
pub use records::*;
pub use reminder::{NewReminder, ReminderRequest, MAX_PARTS, MAX_TARGETS, MAX_TITLE_CHARS};
pub use schedule::{candidates, dst_note, Fold, Schedule};
pub use schema::REQUEST_SHAPES;
pub use selector::{
    chosen_by, resolve_entries, resolve_targets, ImportRefused, NamePattern, Offender,
    SelectorRequest, TargetSelector, CHOSEN_EXPLICIT, MAX_ENTRY_CHARS, MAX_PATTERN_CHARS,
};
pub use standing::{NewChatQuota, QuotaStatus, Reading, Standing, TimeLock};
pub use template::{Pick, RenderVars, Template, GROUP_NAME_FALLBACK, VARIABLES};
pub use users::{
    check_user_name, ApiUser, AuditEntry, AuditFilter, NewApiUser, NewAuditEntry, Role,
    BUILT_IN_PRINCIPALS, MAX_USER_NAME_CHARS,
};
pub use webhooks::{
    webhook_type_names, webhook_type_of, AttemptOutcome, DeliveryStatus, DueDelivery, NewWebhook,
    PreviousSecret, Webhook, WebhookBacklog, WebhookDelivery, WebhookPatch, MAX_SIGNING_SECRETS,
    PING_TYPE, WEBHOOK_TYPES,
};
pub use window::{resolve_local, WindowHours, WindowSpan};
pub use words::duration_words;
