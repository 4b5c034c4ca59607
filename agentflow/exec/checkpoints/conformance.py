"""The checkpoint store conformance suite: plain async checks any store can run.

Each ``check_*`` function takes a store, exercises one rule of `CheckpointStore` on runs
and flows of its own (fresh uuid4 ids, so checks can share a store) and raises
`AssertionError` naming the rule when the store breaks it. Nothing here imports pytest:
a new backend proves itself with

```python
failures = {name: why for name, why in (await validate(make_store)).items() if why}
```

Rows are sealed by a real `Sealer`, so the checks also show that a store hands rows back
exactly as written (their signatures still check). Races across processes need process
plumbing and live in the test suite, not here.

These checks take each rule on its own. Whether the rules hold together, under workers,
a sweep and an operator racing with crashes, stalls and failing operations, is what the
simulation checks: ``agentflow.sim.run_simulation(agentflow.sim.custom(name, episode), ...)``
runs it on a store of yours (docs/simulation.md). It lives above the stores (it drives the
runners and workers), so it is not imported here.

This module is the public entry: the checks live in `_conformance.saves` (the protocol's
members, compare-and-set, history, listing, delete, `stored_runs`, `relist`, rows kept as
written), `_conformance.calls` (call log, fencing, `save_after_calls`, `head`,
concurrency) and `_conformance.leases` (run leases: one holder, renew and release by its
token, lapsing, racing takers), `_conformance.lease_moves` (leases moved with a record or a
save, `LeaseMoving`, and the events a save carries), `_conformance.markers` (markers: one token per key,
lapsing, apart from leases) and `_conformance.retention` (prunes: only old finished
runs, each whole, none under a live lease, judged again as they go, none whose newest row
is not the one judged) and `_conformance.event_chain` (an event stream tampered with reads as tampered, packed or not),
`_conformance.trim` (trims: old finished flow runs keep only
their newest checkpoint, their call log and listing, under the same judgement), their
helpers and `SEALER` in `_conformance.base`; all are re-exported here.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Final

# Each name is imported "as" itself: an explicit re-export, so `conformance.check_*`,
# `SEALER` and `RACERS` stay importable from here (for mypy too).
from agentflow.exec.checkpoints._conformance.base import SEALER as SEALER
from agentflow.exec.checkpoints._conformance.calls import RACERS as RACERS
from agentflow.exec.checkpoints._conformance.calls import check_call_numbering as check_call_numbering
from agentflow.exec.checkpoints._conformance.calls import (
    check_calls_ordered_and_unchanged as check_calls_ordered_and_unchanged,
)
from agentflow.exec.checkpoints._conformance.calls import check_concurrent_first_saves as check_concurrent_first_saves
from agentflow.exec.checkpoints._conformance.calls import check_concurrent_next_saves as check_concurrent_next_saves
from agentflow.exec.checkpoints._conformance.calls import check_concurrent_records as check_concurrent_records
from agentflow.exec.checkpoints._conformance.calls import (
    check_head_counts_records_per_segment as check_head_counts_records_per_segment,
)
from agentflow.exec.checkpoints._conformance.calls import (
    check_record_call_of_unknown_run as check_record_call_of_unknown_run,
)
from agentflow.exec.checkpoints._conformance.calls import (
    check_save_after_calls_is_all_or_nothing as check_save_after_calls_is_all_or_nothing,
)
from agentflow.exec.checkpoints._conformance.calls import (
    check_save_after_calls_numbers_each_segment as check_save_after_calls_numbers_each_segment,
)
from agentflow.exec.checkpoints._conformance.calls import check_started_is_fenced as check_started_is_fenced
from agentflow.exec.checkpoints._conformance.calls import (
    check_started_refused_after_end as check_started_refused_after_end,
)
from agentflow.exec.checkpoints._conformance.event_chain import (
    check_event_chain_reads_clean as check_event_chain_reads_clean,
)
from agentflow.exec.checkpoints._conformance.event_chain import (
    check_event_chain_reports_a_duplicate as check_event_chain_reports_a_duplicate,
)
from agentflow.exec.checkpoints._conformance.event_chain import (
    check_event_chain_reports_a_removed_entry as check_event_chain_reports_a_removed_entry,
)
from agentflow.exec.checkpoints._conformance.event_chain import (
    check_event_chain_reports_a_removed_last_entry as check_event_chain_reports_a_removed_last_entry,
)
from agentflow.exec.checkpoints._conformance.event_chain import (
    check_event_chain_reports_a_reorder as check_event_chain_reports_a_reorder,
)
from agentflow.exec.checkpoints._conformance.event_chain import (
    check_event_chain_reports_a_truncation as check_event_chain_reports_a_truncation,
)
from agentflow.exec.checkpoints._conformance.event_chain import (
    check_event_chain_reports_a_writers_removed_entries as check_event_chain_reports_a_writers_removed_entries,
)
from agentflow.exec.checkpoints._conformance.event_chain import (
    check_event_chain_reports_removed_first_entries as check_event_chain_reports_removed_first_entries,
)
from agentflow.exec.checkpoints._conformance.events import (
    check_compacted_stream_reads_as_before as check_compacted_stream_reads_as_before,
)
from agentflow.exec.checkpoints._conformance.events import (
    check_event_positions_are_append_only as check_event_positions_are_append_only,
)
from agentflow.exec.checkpoints._conformance.events import check_events_are_bounded as check_events_are_bounded
from agentflow.exec.checkpoints._conformance.events import check_events_go_with_the_run as check_events_go_with_the_run
from agentflow.exec.checkpoints._conformance.events import (
    check_events_in_order_with_cursors as check_events_in_order_with_cursors,
)
from agentflow.exec.checkpoints._conformance.events import (
    check_forged_event_is_refused as check_forged_event_is_refused,
)
from agentflow.exec.checkpoints._conformance.lease_moves import (
    check_record_moves_the_lease_of_its_bearer as check_record_moves_the_lease_of_its_bearer,
)
from agentflow.exec.checkpoints._conformance.lease_moves import (
    check_record_refused_by_another_holder_writes_nothing as check_record_refused_by_another_holder_writes_nothing,
)
from agentflow.exec.checkpoints._conformance.lease_moves import (
    check_save_carries_events_only_when_stored as check_save_carries_events_only_when_stored,
)
from agentflow.exec.checkpoints._conformance.lease_moves import (
    check_save_hands_the_lease_on_or_gives_it_up as check_save_hands_the_lease_on_or_gives_it_up,
)
from agentflow.exec.checkpoints._conformance.leases import check_lease_arguments as check_lease_arguments
from agentflow.exec.checkpoints._conformance.leases import check_lease_is_exclusive as check_lease_is_exclusive
from agentflow.exec.checkpoints._conformance.leases import check_lease_lapses as check_lease_lapses
from agentflow.exec.checkpoints._conformance.leases import (
    check_lease_needs_no_checkpoint_and_delete_forgets_it as check_lease_needs_no_checkpoint_and_delete_forgets_it,
)
from agentflow.exec.checkpoints._conformance.leases import check_lease_race_of_takers as check_lease_race_of_takers
from agentflow.exec.checkpoints._conformance.leases import (
    check_lease_released_by_holder_only as check_lease_released_by_holder_only,
)
from agentflow.exec.checkpoints._conformance.leases import (
    check_lease_renewed_by_holder_only as check_lease_renewed_by_holder_only,
)
from agentflow.exec.checkpoints._conformance.leases import (
    check_lease_take_again_by_holder_renews as check_lease_take_again_by_holder_renews,
)
from agentflow.exec.checkpoints._conformance.markers import check_marker_arguments as check_marker_arguments
from agentflow.exec.checkpoints._conformance.markers import check_marker_lapses as check_marker_lapses
from agentflow.exec.checkpoints._conformance.markers import check_marker_race_of_puts as check_marker_race_of_puts
from agentflow.exec.checkpoints._conformance.markers import (
    check_marker_stands_for_its_token as check_marker_stands_for_its_token,
)
from agentflow.exec.checkpoints._conformance.markers import (
    check_marker_taken_by_its_token_only as check_marker_taken_by_its_token_only,
)
from agentflow.exec.checkpoints._conformance.markers import check_markers_are_not_leases as check_markers_are_not_leases
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_judges_each_run_again as check_prune_judges_each_run_again,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_leaves_a_held_run as check_prune_leaves_a_held_run,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_leaves_a_run_that_went_on as check_prune_leaves_a_run_that_went_on,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_leaves_a_run_with_a_live_cancel_request as check_prune_leaves_a_run_with_a_live_cancel_request,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_limit_and_cut_off as check_prune_limit_and_cut_off,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_refuses_runs_that_have_not_ended as check_prune_refuses_runs_that_have_not_ended,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_takes_a_run_with_a_late_earlier_record as check_prune_takes_a_run_with_a_late_earlier_record,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_takes_only_old_finished_runs as check_prune_takes_only_old_finished_runs,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_prune_takes_only_the_judged_row as check_prune_takes_only_the_judged_row,
)
from agentflow.exec.checkpoints._conformance.retention import (
    check_pruned_run_id_starts_afresh as check_pruned_run_id_starts_afresh,
)
from agentflow.exec.checkpoints._conformance.saves import check_delete as check_delete
from agentflow.exec.checkpoints._conformance.saves import check_ended_run_takes_no_save as check_ended_run_takes_no_save
from agentflow.exec.checkpoints._conformance.saves import (
    check_failed_run_takes_only_the_next_step as check_failed_run_takes_only_the_next_step,
)
from agentflow.exec.checkpoints._conformance.saves import check_implements_protocol as check_implements_protocol
from agentflow.exec.checkpoints._conformance.saves import (
    check_latest_and_history_after_many_saves as check_latest_and_history_after_many_saves,
)
from agentflow.exec.checkpoints._conformance.saves import (
    check_latest_of_unknown_run_not_found as check_latest_of_unknown_run_not_found,
)
from agentflow.exec.checkpoints._conformance.saves import check_list_runs as check_list_runs
from agentflow.exec.checkpoints._conformance.saves import check_list_unfinished as check_list_unfinished
from agentflow.exec.checkpoints._conformance.saves import (
    check_new_run_starts_at_step_zero as check_new_run_starts_at_step_zero,
)
from agentflow.exec.checkpoints._conformance.saves import (
    check_relist_of_a_listed_run_changes_nothing as check_relist_of_a_listed_run_changes_nothing,
)
from agentflow.exec.checkpoints._conformance.saves import check_relist_of_unknown_run as check_relist_of_unknown_run
from agentflow.exec.checkpoints._conformance.saves import (
    check_row_must_match_arguments as check_row_must_match_arguments,
)
from agentflow.exec.checkpoints._conformance.saves import (
    check_rows_come_back_as_written as check_rows_come_back_as_written,
)
from agentflow.exec.checkpoints._conformance.saves import check_run_never_changes_flow as check_run_never_changes_flow
from agentflow.exec.checkpoints._conformance.saves import (
    check_save_is_exactly_latest_plus_one as check_save_is_exactly_latest_plus_one,
)
from agentflow.exec.checkpoints._conformance.saves import (
    check_second_step_zero_conflicts as check_second_step_zero_conflicts,
)
from agentflow.exec.checkpoints._conformance.saves import check_stored_runs as check_stored_runs
from agentflow.exec.checkpoints._conformance.trim import (
    check_trim_judges_each_run_again as check_trim_judges_each_run_again,
)
from agentflow.exec.checkpoints._conformance.trim import (
    check_trim_keeps_only_the_newest_checkpoint as check_trim_keeps_only_the_newest_checkpoint,
)
from agentflow.exec.checkpoints._conformance.trim import check_trim_leaves_a_held_run as check_trim_leaves_a_held_run
from agentflow.exec.checkpoints._conformance.trim import (
    check_trim_leaves_a_run_that_went_on as check_trim_leaves_a_run_that_went_on,
)
from agentflow.exec.checkpoints._conformance.trim import (
    check_trim_leaves_a_run_with_a_live_cancel_request as check_trim_leaves_a_run_with_a_live_cancel_request,
)
from agentflow.exec.checkpoints._conformance.trim import (
    check_trim_refuses_runs_that_have_not_ended as check_trim_refuses_runs_that_have_not_ended,
)
from agentflow.exec.checkpoints._conformance.trim import (
    check_trim_takes_only_the_judged_row as check_trim_takes_only_the_judged_row,
)
from agentflow.exec.checkpoints._conformance.trim import (
    check_trimmed_run_is_retried_and_trimmed_again as check_trimmed_run_is_retried_and_trimmed_again,
)
from agentflow.exec.checkpoints.protocol import CheckpointStore

__all__ = ["CHECKS", "SEALER", "Check", "StoreFactory", "validate"]

#: One check: takes a store, raises `AssertionError` if the store breaks the rule.
Check = Callable[[CheckpointStore], Awaitable[None]]
#: Makes a fresh store (or a coroutine that returns one) for `validate`.
StoreFactory = Callable[[], CheckpointStore | Awaitable[CheckpointStore]]

#: Every check, in the order `validate` runs them.
CHECKS: Final[tuple[Check, ...]] = (
    check_implements_protocol,
    check_new_run_starts_at_step_zero,
    check_second_step_zero_conflicts,
    check_save_is_exactly_latest_plus_one,
    check_ended_run_takes_no_save,
    check_failed_run_takes_only_the_next_step,
    check_run_never_changes_flow,
    check_row_must_match_arguments,
    check_latest_and_history_after_many_saves,
    check_latest_of_unknown_run_not_found,
    check_list_unfinished,
    check_list_runs,
    check_delete,
    check_stored_runs,
    check_relist_of_unknown_run,
    check_relist_of_a_listed_run_changes_nothing,
    check_call_numbering,
    check_calls_ordered_and_unchanged,
    check_started_is_fenced,
    check_started_refused_after_end,
    check_record_call_of_unknown_run,
    check_save_after_calls_is_all_or_nothing,
    check_save_after_calls_numbers_each_segment,
    check_head_counts_records_per_segment,
    check_rows_come_back_as_written,
    check_concurrent_first_saves,
    check_concurrent_next_saves,
    check_concurrent_records,
    check_lease_is_exclusive,
    check_lease_take_again_by_holder_renews,
    check_lease_renewed_by_holder_only,
    check_lease_lapses,
    check_lease_released_by_holder_only,
    check_lease_race_of_takers,
    check_lease_needs_no_checkpoint_and_delete_forgets_it,
    check_lease_arguments,
    check_record_moves_the_lease_of_its_bearer,
    check_record_refused_by_another_holder_writes_nothing,
    check_save_hands_the_lease_on_or_gives_it_up,
    check_save_carries_events_only_when_stored,
    check_marker_stands_for_its_token,
    check_marker_lapses,
    check_marker_taken_by_its_token_only,
    check_marker_race_of_puts,
    check_markers_are_not_leases,
    check_marker_arguments,
    check_prune_takes_only_old_finished_runs,
    check_prune_refuses_runs_that_have_not_ended,
    check_prune_leaves_a_held_run,
    check_prune_judges_each_run_again,
    check_pruned_run_id_starts_afresh,
    check_prune_limit_and_cut_off,
    check_prune_takes_only_the_judged_row,
    check_prune_leaves_a_run_that_went_on,
    check_prune_takes_a_run_with_a_late_earlier_record,
    check_prune_leaves_a_run_with_a_live_cancel_request,
    check_trim_keeps_only_the_newest_checkpoint,
    check_trim_refuses_runs_that_have_not_ended,
    check_trim_leaves_a_held_run,
    check_trim_judges_each_run_again,
    check_trimmed_run_is_retried_and_trimmed_again,
    check_trim_takes_only_the_judged_row,
    check_trim_leaves_a_run_that_went_on,
    check_trim_leaves_a_run_with_a_live_cancel_request,
    check_events_in_order_with_cursors,
    check_event_positions_are_append_only,
    check_events_are_bounded,
    check_events_go_with_the_run,
    check_forged_event_is_refused,
    check_compacted_stream_reads_as_before,
    check_event_chain_reads_clean,
    check_event_chain_reports_a_duplicate,
    check_event_chain_reports_a_removed_entry,
    check_event_chain_reports_a_writers_removed_entries,
    check_event_chain_reports_a_removed_last_entry,
    check_event_chain_reports_a_reorder,
    check_event_chain_reports_a_truncation,
    check_event_chain_reports_removed_first_entries,
)


async def validate(store_factory: StoreFactory) -> dict[str, str | None]:
    """Run every check on its own fresh store.

    Args:
        store_factory: returns a new, empty store (or an awaitable of one). Each store is
            closed with `aclose()` after its check.

    Returns:
        Each check's name mapped to None if the store passed it, else why it failed.
    """
    report: dict[str, str | None] = {}
    for check in CHECKS:
        made = store_factory()
        store = await made if inspect.isawaitable(made) else made
        try:
            await check(store)
        except AssertionError as exc:
            report[check.__name__] = str(exc)
        except Exception as exc:
            report[check.__name__] = f"{type(exc).__name__}: {exc}"
        else:
            report[check.__name__] = None
        finally:
            await store.aclose()
    return report
