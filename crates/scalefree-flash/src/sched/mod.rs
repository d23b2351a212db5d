//! The scheduler: tasks, the DAG they form, the prioritizer, and the run loop.

pub mod prioritizer;
pub mod scheduler;
pub mod task;

pub use prioritizer::Priority;
pub use scheduler::{Dag, RunStats};
pub use task::{FnTask, Injector, Task, TaskBuffers, TaskContext, TaskId};

#[cfg(test)]
mod tests;
