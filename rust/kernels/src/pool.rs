//! The kernels' worker threads: started once and kept up between calls, so
//! that a call split across threads costs a wake-up, not a thread spawned and
//! joined (a decode step makes about 240 kernel calls of 30 us to 1 ms each;
//! a spawn and join per call cost more than the second thread gave:
//! docs/real-model-speed.md, "Lever 3: threads").
//!
//! A worker that has finished its part spins a short while for the next call
//! (the Python between two kernel calls of a step takes tens of
//! microseconds) and then sleeps until woken. The thread that calls
//! [`run`] does part 0 itself. Two threads calling at once do not wait for
//! each other: the one that finds the pool busy runs every part itself, which
//! gives the same result (each part writes only its own outputs).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a worker spins for the next call before it sleeps.
const WORKER_SPIN: Duration = Duration::from_micros(200);
/// How long the caller spins for the workers' parts before it sleeps.
const CALLER_SPIN: Duration = Duration::from_millis(2);
/// How long a spin pauses the CPU before it yields it instead.
const YIELD_AFTER: Duration = Duration::from_micros(20);
/// `state` keeps the part count in its low bits and the call's number above.
const PARTS_BITS: u32 = 16;
/// Most parts one call is split into (the rest of 64 bits count calls).
pub const MAX_PARTS: usize = (1 << PARTS_BITS) - 1;

/// Runs `part(0)`, ..., `part(parts - 1)`, each once, part 0 on the calling
/// thread and the others on the pool's workers, and returns when all are done.
/// A panic in a part aborts the process (the kernels' parts do not panic on
/// checked inputs; unwinding across the workers would leave the call's
/// outputs half written).
pub fn run(parts: usize, part: &(dyn Fn(usize) + Sync)) {
    let parts = parts.min(MAX_PARTS);
    if parts <= 1 {
        return part(0);
    }
    let pool = pool();
    let Some(mut dispatch) = pool.try_dispatch() else {
        // Another thread's call holds the workers: same parts, in order, here.
        return (0..parts).for_each(part);
    };
    dispatch.ensure_workers(parts - 1);
    let shared = &dispatch.shared;
    let abort_on_unwind = AbortOnUnwind;
    // SAFETY: `part` outlives the call: this function returns only once
    // every worker that was given the call has finished it (`pending`).
    unsafe { *shared.job.get() = Some(std::mem::transmute::<&(dyn Fn(usize) + Sync), JobRef>(part)) };
    shared.pending.store(parts - 1, SeqCst);
    let call = (shared.state.load(SeqCst) >> PARTS_BITS) + 1;
    shared.state.store(call << PARTS_BITS | parts as u64, SeqCst);
    for worker in &dispatch.workers[..parts - 1] {
        if worker.sleeping.load(SeqCst) {
            worker.thread.unpark();
        }
    }
    part(0);
    let started = Instant::now();
    while shared.pending.load(SeqCst) != 0 {
        if started.elapsed() < CALLER_SPIN {
            pause(started);
            continue;
        }
        shared.caller_sleeping.store(true, SeqCst);
        if shared.pending.load(SeqCst) != 0 {
            std::thread::park();
        }
        shared.caller_sleeping.store(false, SeqCst);
    }
    unsafe { *shared.job.get() = None };
    std::mem::forget(abort_on_unwind);
}

/// A part, its lifetime erased: valid while its call runs.
type JobRef = &'static (dyn Fn(usize) + Sync);

/// Aborts when dropped by an unwinding panic between the dispatch and the
/// workers' end (see [`run`]).
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!("vllm-rs kernels: a part of a kernel call panicked; aborting");
        std::process::abort();
    }
}

/// The state one call shares with the workers.
struct Shared {
    /// Call number << PARTS_BITS | parts; a new value starts a call.
    state: AtomicU64,
    /// Workers' parts of the current call not yet finished.
    pending: AtomicUsize,
    /// The current call's parts; written only while no worker runs one.
    job: UnsafeCell<Option<JobRef>>,
    caller: Mutex<Option<Thread>>,
    caller_sleeping: AtomicBool,
}

// SAFETY: `job` is written by the dispatching thread only while no worker
// reads it (before `state` announces a call, after `pending` reaches 0).
unsafe impl Sync for Shared {}

struct Worker {
    thread: Thread,
    sleeping: Arc<AtomicBool>,
}

/// The process's pool, made anew in a forked child (whose copy has no
/// threads behind it).
struct Pool {
    pid: u32,
    dispatch: Mutex<Dispatch>,
}

struct Dispatch {
    shared: Arc<Shared>,
    workers: Vec<Worker>,
}

fn pool() -> &'static Pool {
    static POOL: Mutex<Option<&'static Pool>> = Mutex::new(None);
    let mut current = POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let pid = std::process::id();
    match *current {
        Some(pool) if pool.pid == pid => pool,
        _ => {
            // A parent's pool is leaked in a forked child: its threads are not here.
            let shared = Shared {
                state: AtomicU64::new(0),
                pending: AtomicUsize::new(0),
                job: UnsafeCell::new(None),
                caller: Mutex::new(None),
                caller_sleeping: AtomicBool::new(false),
            };
            let dispatch = Dispatch { shared: Arc::new(shared), workers: Vec::new() };
            let pool = Box::leak(Box::new(Pool { pid, dispatch: Mutex::new(dispatch) }));
            *current = Some(pool);
            pool
        }
    }
}

impl Pool {
    fn try_dispatch(&self) -> Option<MutexGuard<'_, Dispatch>> {
        let guard = match self.dispatch.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        *guard.shared.caller.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::thread::current());
        Some(guard)
    }
}

impl Dispatch {
    /// Starts workers until there are `count`.
    fn ensure_workers(&mut self, count: usize) {
        while self.workers.len() < count {
            let index = self.workers.len() + 1;
            let (shared, sleeping) = (self.shared.clone(), Arc::new(AtomicBool::new(false)));
            let worker_sleeping = sleeping.clone();
            // The calls so far are not its own: read here, before the next is announced.
            let seen = self.shared.state.load(SeqCst) >> PARTS_BITS;
            let handle = std::thread::Builder::new()
                .name(format!("vllm-rs-kernel-{index}"))
                .spawn(move || work(&shared, index, seen, &worker_sleeping))
                .expect("starting a kernel worker thread");
            self.workers.push(Worker { thread: handle.thread().clone(), sleeping });
        }
    }
}

/// A worker's life: wait for a call, run its part if the call has one for it.
fn work(shared: &Shared, index: usize, mut seen: u64, sleeping: &AtomicBool) {
    loop {
        let state = wait_for_call(shared, seen, sleeping);
        seen = state >> PARTS_BITS;
        if index >= (state & MAX_PARTS as u64) as usize {
            continue; // a call of fewer parts: not this worker's
        }
        // SAFETY: the caller set the job before announcing the call and
        // keeps it until this worker's part is counted off.
        let part = unsafe { (*shared.job.get()).expect("a call announced with its job") };
        let abort_on_unwind = AbortOnUnwind;
        part(index);
        std::mem::forget(abort_on_unwind);
        if shared.pending.fetch_sub(1, SeqCst) == 1 && shared.caller_sleeping.load(SeqCst) {
            if let Some(caller) = &*shared.caller.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
                caller.unpark();
            }
        }
    }
}

/// One turn of a spin begun at `started`: a CPU pause at first, then a
/// yield, so that a thread that spins on a busy CPU lets the one it waits for
/// (or any other) run there.
fn pause(started: Instant) {
    if started.elapsed() < YIELD_AFTER {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Spins, then sleeps, until a call after call number `seen`; its state.
fn wait_for_call(shared: &Shared, seen: u64, sleeping: &AtomicBool) -> u64 {
    let started = Instant::now();
    loop {
        let state = shared.state.load(SeqCst);
        if state >> PARTS_BITS != seen {
            return state;
        }
        if started.elapsed() < WORKER_SPIN {
            pause(started);
            continue;
        }
        // Announce the sleep, then look once more: the caller sets `state`
        // before it reads `sleeping`, so one of the two sees the other.
        sleeping.store(true, SeqCst);
        if shared.state.load(SeqCst) >> PARTS_BITS == seen {
            std::thread::park();
        }
        sleeping.store(false, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_part_runs_once_per_call() {
        for parts in [1, 2, 3, 5, 2, 1, 4] {
            let counts: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..100 {
                run(parts, &|p| {
                    counts[p].fetch_add(1, SeqCst);
                });
            }
            assert!(counts.iter().all(|c| c.load(SeqCst) == 100), "{parts} parts: {counts:?}");
        }
    }

    #[test]
    fn calls_from_several_threads_at_once_each_run_every_part() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        run(3, &|p| {
                            total.fetch_add(p + 1, SeqCst);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(SeqCst), 4 * 200 * (1 + 2 + 3));
    }

    #[test]
    fn sleeping_workers_are_woken() {
        let done = AtomicUsize::new(0);
        run(2, &|_| {
            done.fetch_add(1, SeqCst);
        });
        // Past WORKER_SPIN the worker sleeps; the next call must still run.
        let until = Instant::now() + WORKER_SPIN * 5;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        run(2, &|_| {
            done.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 4);
    }
}
