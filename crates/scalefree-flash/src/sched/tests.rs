//! Run-loop tests: DAG order, injection, budget, write-back, failures, prioritization.

use std::sync::Mutex;

use crate::error::FlashError;
use crate::file::FlashPtr;
use crate::io::Access;
use crate::runtime::{Runtime, RuntimeOptions};
use crate::sched::{FnTask, Priority, TaskId};

fn runtime(budget_bytes: u64, priority: Priority, max_tasks_in_flight: usize) -> Runtime {
    Runtime::new(RuntimeOptions { memory_budget_bytes: budget_bytes, compute_threads: 2, io_threads: 2, priority, max_tasks_in_flight, ..RuntimeOptions::default() }).unwrap()
}

#[test]
fn children_run_after_parents() {
    let rt = runtime(1 << 20, Priority::FewestBytesToFetch, 4);
    let order = Mutex::new(Vec::new());
    let dag = rt.dag();
    let record = |name: &'static str| {
        let order = &order;
        FnTask::new(name, vec![], move |_, _| {
            order.lock().unwrap().push(name);
            Ok(())
        })
    };
    // A diamond a -> {b, c} -> d, then a chain d -> e -> f, plus an independent g.
    let a = dag.add(record("a"), &[]).unwrap();
    let b = dag.add(record("b"), &[a]).unwrap();
    let c = dag.add(record("c"), &[a]).unwrap();
    let d = dag.add(record("d"), &[b, c]).unwrap();
    let e = dag.add(record("e"), &[d]).unwrap();
    dag.add(record("f"), &[e]).unwrap();
    dag.add(record("g"), &[]).unwrap();
    let stats = dag.run().unwrap();
    assert_eq!(stats.tasks_completed, 7);
    let order = order.into_inner().unwrap();
    let at = |n: &str| order.iter().position(|&x| x == n).unwrap();
    for (parent, child) in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"), ("e", "f")] {
        assert!(at(parent) < at(child), "{parent} ran after {child}: {order:?}");
    }
}

#[test]
fn tasks_inject_tasks_while_running() {
    let rt = runtime(1 << 20, Priority::FewestBytesToFetch, 4);
    let count = Mutex::new(Vec::<u32>::new());
    let dag = rt.dag();
    let count_ref = &count;
    fn spawn_level<'a>(level: u32, count: &'a Mutex<Vec<u32>>) -> FnTask<impl FnMut(&mut crate::sched::TaskBuffers<'_>, &crate::sched::TaskContext<'a>) -> crate::Result<()> + Send + 'a> {
        FnTask::new(format!("level {level}"), vec![], move |_, ctx| {
            count.lock().unwrap().push(level);
            if level < 4 {
                let me = ctx.task_id();
                ctx.inject(spawn_level(level + 1, count), &[me])?;
                ctx.inject(spawn_level(level + 1, count), &[me])?;
            }
            Ok(())
        })
    }
    dag.add(spawn_level(0, count_ref), &[]).unwrap();
    let stats = dag.run().unwrap();
    assert_eq!(stats.tasks_completed, 31, "a binary tree of depth 4 injected level by level");
    let levels = count.into_inner().unwrap();
    assert_eq!(levels.len(), 31);
    assert_eq!(levels.iter().filter(|&&l| l == 4).count(), 16);
}

#[test]
fn injector_from_another_thread() {
    let rt = runtime(1 << 20, Priority::Fifo, 2);
    let seen = Mutex::new(0u32);
    let dag = rt.dag();
    let injector = dag.injector();
    let seen_ref = &seen;
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut last: Option<TaskId> = None;
            for _ in 0..10 {
                let parents: Vec<TaskId> = last.into_iter().collect();
                last = Some(injector.inject(FnTask::new("late", vec![], move |_, _| {
                    *seen_ref.lock().unwrap() += 1;
                    Ok(())
                }), &parents).unwrap());
            }
        });
        let stats = dag.run().unwrap();
        assert_eq!(stats.tasks_completed, 10);
    });
    assert_eq!(seen.into_inner().unwrap(), 10);
}

#[test]
fn a_task_larger_than_the_budget_is_refused() {
    let rt = runtime(4096, Priority::FewestBytesToFetch, 2);
    let x = FlashPtr::<f32>::scratch(rt.dir(), 2048, &rt.file_options()).unwrap();
    let dag = rt.dag();
    let err = dag.add(FnTask::new("big", vec![Access::read(x.access(0, 2048).unwrap())], |_, _| Ok(())), &[]).unwrap_err();
    assert!(matches!(err, FlashError::OutOfBudget { needed_bytes: 8192, budget_bytes: 4096, .. }), "{err}");
    let overlapping = vec![Access::read(x.access(0, 10).unwrap()), Access::write(x.access(5, 10).unwrap())];
    assert!(matches!(dag.add(FnTask::new("aliasing", overlapping, |_, _| Ok(())), &[]), Err(FlashError::InvalidArgument(_))));
    assert!(matches!(dag.add(FnTask::new("orphan", vec![], |_, _| Ok(())), &[TaskId(99)]), Err(FlashError::InvalidArgument(_))));
}

#[test]
fn failures_stop_the_run_with_the_task_named() {
    let rt = runtime(1 << 20, Priority::FewestBytesToFetch, 2);
    let dag = rt.dag();
    let first = dag.add(FnTask::new("fine", vec![], |_, _| Ok(())), &[]).unwrap();
    let bad = dag.add(FnTask::new("broken", vec![], |_, _| Err(FlashError::invalid("no good"))), &[first]).unwrap();
    dag.add(FnTask::new("never", vec![], |_, _| panic!("must not run")), &[bad]).unwrap();
    let err = dag.run().unwrap_err();
    assert!(matches!(&err, FlashError::TaskFailed { task, reason } if task == "broken" && reason.contains("no good")), "{err}");
    let dag = rt.dag();
    dag.add(FnTask::new("panicky", vec![], |_, _| panic!("boom")), &[]).unwrap();
    let err = dag.run().unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
}

/// y[i] = 2 x[i] + 1 over blocks, then z = sum over a chain into one block, with a budget of
/// three blocks for 2 x 64 blocks of data: every output must be written back correctly.
#[test]
fn write_back_with_a_budget_far_below_the_data() {
    let block = 1024u64;
    let blocks = 64u64;
    let budget = 3 * block * 4;
    for priority in [Priority::FewestBytesToFetch, Priority::Fifo] {
        let rt = runtime(budget, priority, 3);
        let x_values: Vec<f32> = (0..block * blocks).map(|i| (i % 977) as f32).collect();
        let x = FlashPtr::from_slice(rt.dir(), &x_values, &rt.file_options()).unwrap();
        let y = FlashPtr::<f32>::scratch(rt.dir(), block * blocks, &rt.file_options()).unwrap();
        let total = FlashPtr::<f32>::scratch(rt.dir(), block, &rt.file_options()).unwrap();
        let dag = rt.dag();
        let mut last = None;
        for b in 0..blocks {
            let accesses = vec![Access::read(x.access(b * block, block).unwrap()), Access::write(y.access(b * block, block).unwrap())];
            let map = dag
                .add(FnTask::new("map", accesses, |bufs, _| {
                    let input = bufs.read::<f32>(0);
                    let out = bufs.take_write::<f32>(1);
                    for (o, i) in out.iter_mut().zip(input) {
                        *o = 2.0 * i + 1.0;
                    }
                    Ok(())
                }), &[])
                .unwrap();
            // Accumulate chain on `total`: total += y block (ReadWrite, stays in memory).
            let parents: Vec<TaskId> = last.into_iter().chain([map]).collect();
            let accesses = vec![Access::read(y.access(b * block, block).unwrap()), Access::read_write(total.access(0, block).unwrap())];
            last = Some(
                dag.add(FnTask::new("sum", accesses, |bufs, _| {
                    let part = bufs.read::<f32>(0);
                    let acc = bufs.take_write::<f32>(1);
                    for (a, p) in acc.iter_mut().zip(part) {
                        *a += p;
                    }
                    Ok(())
                }), &parents)
                .unwrap(),
            );
        }
        let stats = dag.run().unwrap();
        assert!(stats.cache.peak_resident_bytes <= budget, "peak {} above budget {budget}", stats.cache.peak_resident_bytes);
        assert!(stats.cache.evictions > 0);
        let y_back = y.to_vec().unwrap();
        for (i, (&yv, &xv)) in y_back.iter().zip(&x_values).enumerate() {
            assert_eq!(yv, 2.0 * xv + 1.0, "y[{i}] ({priority:?})");
        }
        let total_back = total.to_vec().unwrap();
        for j in 0..block as usize {
            let want: f32 = (0..blocks as usize).map(|b| 2.0 * x_values[b * block as usize + j] + 1.0).sum();
            assert_eq!(total_back[j], want, "total[{j}] ({priority:?})");
        }
    }
}

/// Tasks alternate between two shared inputs A and B that do not fit together: FIFO reads
/// them again and again, the prioritizer runs every task of the resident input first.
#[test]
fn prioritizer_reads_fewer_bytes_than_fifo() {
    let block = 4096u64;
    let mut prefetched = Vec::new();
    for priority in [Priority::FewestBytesToFetch, Priority::Fifo] {
        let rt = runtime(block * 4 + 2 * 4 * 16, priority, 1);
        let inputs = FlashPtr::<f32>::from_slice(rt.dir(), &vec![1.0; 2 * block as usize], &rt.file_options()).unwrap();
        let outputs = FlashPtr::<f32>::scratch(rt.dir(), 16 * 16, &rt.file_options()).unwrap();
        let dag = rt.dag();
        for t in 0..16u64 {
            let input = inputs.access((t % 2) * block, block).unwrap();
            let accesses = vec![Access::read(input), Access::write(outputs.access(t * 16, 16).unwrap())];
            dag.add(FnTask::new("reduce", accesses, |bufs, _| {
                let s: f32 = bufs.read::<f32>(0).iter().sum();
                bufs.take_write::<f32>(1).fill(s);
                Ok(())
            }), &[])
            .unwrap();
        }
        let stats = dag.run().unwrap();
        assert!(outputs.to_vec().unwrap().iter().all(|&v| v == block as f32));
        prefetched.push(stats.cache.bytes_prefetched);
    }
    assert_eq!(prefetched[0], 2 * 4 * 4096, "prioritized: each input read once");
    assert!(prefetched[1] > prefetched[0], "fifo should thrash: {prefetched:?}");
}

/// A chain's next task has its read-only input prefetched while its parent computes (the
/// child's commit then finds it present: a hit), its values are right, and the budget holds.
#[test]
fn a_childs_inputs_are_prefetched_while_its_parent_computes() {
    let rt = runtime(64 << 10, Priority::FewestBytesToFetch, 4);
    let values: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let x = FlashPtr::from_slice(rt.dir(), &values, &rt.file_options()).unwrap();
    let y = FlashPtr::<f32>::scratch(rt.dir(), 1024, &rt.file_options()).unwrap();
    let dag = rt.dag();
    // Four chained tasks, each reading its own quarter of x and adding it into y.
    let mut previous: Option<TaskId> = None;
    for quarter in 0..4u64 {
        let accesses = vec![Access::read(x.access(quarter * 1024, 1024).unwrap()), Access::read_write(y.access(0, 1024).unwrap())];
        let task = FnTask::new(format!("add {quarter}"), accesses, |buffers, _| {
            let input = buffers.read::<f32>(0);
            for (out, value) in buffers.take_write::<f32>(1).iter_mut().zip(input) {
                *out += value;
            }
            Ok(())
        });
        previous = Some(dag.add(task, &previous.into_iter().collect::<Vec<_>>()).unwrap());
    }
    let stats = dag.run().unwrap();
    assert_eq!(stats.tasks_completed, 4);
    // y: three hits along the chain, plus x's quarters 1..3 prefetched for the children.
    assert!(stats.cache.hits >= 6, "{:?}", stats.cache);
    assert!(stats.cache.peak_resident_bytes <= 64 << 10);
    let got = y.to_vec().unwrap();
    for (i, value) in got.iter().enumerate() {
        let want: f32 = (0..4).map(|q| (q * 1024 + i) as f32).sum();
        assert_eq!(*value, want, "y[{i}]");
    }
}
