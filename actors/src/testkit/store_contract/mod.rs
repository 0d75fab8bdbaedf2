//! The contract every [`Store`] must meet, written once against
//! `Arc<dyn Store>`: the sqlx store runs it on SQLite and PostgreSQL, the
//! memory store runs it too.
//!
//! Each `pub async fn` is one test and takes a brand-new, empty store.
//! [`run_all`] runs them all in order, naming each on stderr, so a failure
//! points at the test that broke.
//!
//! Conventions the suite pins down where the trait's docs are silent:
//! - positions (reminder parts and targets, run targets) count from 0;
//! - lists of accounts are ordered by id, reminders by id ascending, runs
//!   newest first, unfinished runs oldest first;
//! - a `limit` of 0 means "no limit";
//! - instants round-trip exactly at microsecond precision (the suite only
//!   uses whole seconds);
//! - an unknown target id in a transition batch fails the whole batch with
//!   NotFound;
//! - deleting an account takes its archived reminders (and their runs) along.
//!
//! Imports: `domain`, `ports` (the store traits under test) and `lifecycle`.

use crate::ports::*;
use std::future::Future;
use std::sync::Arc;

mod accounts;
mod amend;
mod events;
mod fixtures;
mod groups;
mod media;
mod polls;
mod receipts;
mod reminders;
mod runs;
mod scale;
mod sessions;
mod transitions;
mod users;
mod webhooks;

pub use accounts::*;
pub use amend::*;
pub use events::*;
pub use groups::*;
pub use media::*;
pub use polls::*;
pub use receipts::*;
pub use reminders::*;
pub use runs::*;
pub use scale::*;
pub use sessions::*;
pub use transitions::*;
pub use users::*;
pub use webhooks::*;

/// Runs every test, each on a store from `fresh`.
pub async fn run_all<F, Fut>(fresh: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    macro_rules! tests {
        ($($t:ident),+ $(,)?) => {
            $(
                let store = fresh().await;
                eprintln!("store contract [{}]: {}", store.backend(), stringify!($t));
                $t(store).await;
            )+
        };
    }
    tests!(
        accounts_crud,
        account_delete_rules,
        media_is_idempotent,
        upload_handles,
        reminders_round_trip,
        reminder_titles_name_runs,
        rejected_writes_change_nothing,
        create_run_is_idempotent,
        create_run_under_concurrent_callers,
        create_runs_is_create_run_for_each,
        create_runs_under_concurrent_callers,
        create_targets_is_idempotent,
        chosen_targets_keep_how_they_were_chosen,
        transitions_follow_the_rules,
        a_thousand_transitions_in_one_batch,
        transition_batches_are_atomic,
        resume_after_crash,
        update_run_changes_only_given_fields,
        update_run_is_compare_and_set,
        a_stop_request_is_kept_until_a_retry,
        finishing_skips_open_targets_in_the_same_write,
        target_marks_apply_only_from_their_statuses,
        sent_since_reads_recent_sends_of_one_account,
        sent_since_sees_lost_answers_and_retried_runs,
        list_runs_filters_and_paging,
        events_append_and_read,
        events_append_in_batches,
        account_states_read_one_account_since_a_time,
        group_directory_sync,
        group_names_cover_left_groups_and_skip_unknown_ones,
        group_listing_filters_and_pages,
        group_labels,
        reminder_summaries_page_by_id,
        accounts_page_by_id,
        reminder_schedules_read_changes_since_a_version,
        the_change_feed_misses_no_write_under_concurrent_writers,
        prune_runs_keeps_unfinished_and_newest_runs,
        prune_events_records_how_far_it_went,
        prune_media_deletes_only_what_no_reminder_uses,
        console_sessions_live_until_they_expire,
        console_sessions_past_the_cap_end_the_soonest_first,
        users_are_found_by_token_until_they_expire_or_are_revoked,
        revoking_a_user_ends_their_console_sessions,
        audit_entries_filter_page_newest_first_and_prune,
        webhook_deliveries_are_made_with_their_event_for_matching_subscriptions,
        webhook_claims_attempts_retries_and_disabling,
        a_disabled_webhook_holds_its_deliveries_until_enabled,
        a_webhook_the_sender_disables_holds_the_rest,
        a_second_rotation_keeps_the_first_secret_until_its_own_end,
        receipts_count_each_participant_once_per_group,
        receipts_counted_at_once_by_several_callers_add_up,
        receipts_go_with_their_run,
        a_runs_receipts_are_reported_once,
        a_poll_part_is_stored_as_written,
        votes_keep_each_voters_latest_choice_once,
        a_multiple_choice_vote_counts_each_option,
        votes_counted_at_once_by_several_callers_keep_the_latest,
        votes_go_with_their_run,
        amendments_mark_each_group_once,
        amendments_go_with_their_run,
    );
}
