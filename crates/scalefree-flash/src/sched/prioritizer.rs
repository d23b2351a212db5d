//! The prioritizer (paper §3.3): among ready tasks, prefer the one that needs the fewest
//! bytes fetched given what the program cache holds, so buffers are shared and accumulate
//! chains keep their output block in memory. Ties go to the task that became ready first.

use crate::cache::program_cache::ProgramCache;
use crate::io::{AccessMode, AccessSpec};

use super::task::TaskId;

/// How the next task to prefetch is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Fewest bytes to fetch first (the paper's heuristic).
    FewestBytesToFetch,
    /// First ready, first served.
    Fifo,
}

/// Up to `count` candidates from `ready`, best first. Only the first `window` ready tasks are
/// scored, which bounds the cost per decision on very wide DAGs.
pub(crate) fn candidates<'a>(
    ready: &[TaskId],
    accesses_of: impl Fn(TaskId) -> &'a [(AccessSpec, AccessMode)],
    cache: &ProgramCache,
    priority: Priority,
    window: usize,
    count: usize,
) -> Vec<TaskId> {
    match priority {
        Priority::Fifo => ready.iter().take(count).copied().collect(),
        Priority::FewestBytesToFetch => {
            let mut scored: Vec<(u64, usize, TaskId)> = ready.iter().take(window).enumerate().map(|(order, &id)| (cache.bytes_to_fetch(accesses_of(id)), order, id)).collect();
            let count = count.min(scored.len());
            if count == 0 {
                return Vec::new();
            }
            scored.select_nth_unstable(count - 1);
            scored.truncate(count);
            scored.sort_unstable();
            scored.into_iter().map(|(_, _, id)| id).collect()
        }
    }
}
