//! The kernels' worker threads: started once and kept up between calls, so
//! that a call split across threads costs a wake-up, not a thread spawned and
//! joined (a decode step makes about 240 kernel calls of 30 us to 1 ms each;
//! a spawn and join per call cost more than the second thread gave). With
//! this pool 2 threads make a batch-1 SmolLM2 decode step 1.2x and a
//! batch-16 one 1.3-1.7x faster than 1 thread, where a thread spawned per
//! call made batch 1 2x slower (the engine driven directly, step medians;
//! docs/real-model-speed.md, "Threads").
//!
//! A call is cut into more parts than threads, and the calling thread and
//! the workers take the next part not yet taken until none is left. So a
//! thread that starts late or is preempted (the frontend, the client and
//! the hypervisor share these CPUs) holds the call up by at most the part
//! it is running, where fixed halves made the other thread wait for its
//! whole half: beside a neighbour that woke every millisecond, 4 parts per
//! thread took 4-6% off a batch-16 decode step (docs/real-model-speed.md,
//! "Parts taken, not given").
//!
//! A worker that has finished spins a short while for the next call (the
//! Python between two kernel calls of a step takes tens of microseconds)
//! and then sleeps until woken. Two threads calling at once do not wait for
//! each other: the one that finds the pool busy runs every part itself,
//! which gives the same result (each part writes only its own outputs).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a worker spins for the next call before it sleeps: longer than
/// the Python between two kernel calls of a step (tens of microseconds), so
/// a step's calls find it awake; the price is a second core busy for the
/// whole step (docs/real-model-speed.md, "Threads").
const WORKER_SPIN: Duration = Duration::from_micros(200);
/// How long the caller spins for the workers' parts before it sleeps.
const CALLER_SPIN: Duration = Duration::from_millis(2);
/// How long a spin pauses the CPU before it yields it instead.
const YIELD_AFTER: Duration = Duration::from_micros(20);
/// `claim` holds the call's number above `CALL_SHIFT`, its part count above
/// `PARTS_SHIFT` and the next part to take in the low bits.
const CALL_SHIFT: u32 = 32;
const PARTS_SHIFT: u32 = 16;
/// Most parts one call is cut into.
pub const MAX_PARTS: usize = (1 << PARTS_SHIFT) - 1;

fn pack(call: u64, parts: usize, next: usize) -> u64 {
    call << CALL_SHIFT | (parts as u64) << PARTS_SHIFT | next as u64
}

/// `(call, parts, next)` of a `claim` word.
fn unpack(word: u64) -> (u64, usize, usize) {
    (word >> CALL_SHIFT, (word >> PARTS_SHIFT) as usize & MAX_PARTS, word as usize & MAX_PARTS)
}

/// Runs `part(0)`, ..., `part(parts - 1)`, each once, on the calling thread
/// and up to `threads - 1` of the pool's workers, each thread taking the
/// next part not yet taken; returns when all are done. A panic in a part
/// aborts the process (the kernels' parts do not panic on checked inputs;
/// unwinding across the workers would leave the call's outputs half
/// written).
pub fn run(parts: usize, threads: usize, part: &(dyn Fn(usize) + Sync)) {
    let parts = parts.min(MAX_PARTS);
    let helpers = threads.min(parts).saturating_sub(1);
    if helpers == 0 {
        return (0..parts).for_each(part);
    }
    let pool = pool();
    let Some(mut dispatch) = pool.try_dispatch() else {
        // Another thread's call holds the workers: same parts, in order, here.
        return (0..parts).for_each(part);
    };
    dispatch.ensure_workers(helpers);
    let shared = &dispatch.shared;
    let abort_on_unwind = AbortOnUnwind;
    // SAFETY: `part` outlives the call: this function returns only once
    // every part taken has been run (`done`), and no part of this call can be
    // taken after that (every part is).
    unsafe { *shared.job.get() = Some(std::mem::transmute::<&(dyn Fn(usize) + Sync), JobRef>(part)) };
    shared.done.store(0, SeqCst);
    shared.helpers.store(helpers, SeqCst);
    let call = (shared.claim.load(SeqCst) >> CALL_SHIFT) + 1;
    shared.claim.store(pack(call, parts, 0), SeqCst);
    for worker in &dispatch.workers[..helpers] {
        if worker.sleeping.load(SeqCst) {
            worker.thread.unpark();
        }
    }
    take_parts(shared, call);
    let started = Instant::now();
    while shared.done.load(SeqCst) != parts {
        if started.elapsed() < CALLER_SPIN {
            pause(started);
            continue;
        }
        shared.caller_sleeping.store(true, SeqCst);
        if shared.done.load(SeqCst) != parts {
            std::thread::park();
        }
        shared.caller_sleeping.store(false, SeqCst);
    }
    unsafe { *shared.job.get() = None };
    std::mem::forget(abort_on_unwind);
}

/// Takes the parts of call number `call` not yet taken, one at a time, and
/// runs them, until none is left (or that call is over).
fn take_parts(shared: &Shared, call: u64) {
    loop {
        let word = shared.claim.load(SeqCst);
        let (current, parts, next) = unpack(word);
        if current != call || next >= parts {
            return;
        }
        if shared.claim.compare_exchange(word, word + 1, SeqCst, SeqCst).is_err() {
            continue; // another thread took it first
        }
        // SAFETY: the caller set the job before announcing the call and
        // keeps it until every part is done, this one included.
        let part = unsafe { (*shared.job.get()).expect("a call announced with its job") };
        let abort_on_unwind = AbortOnUnwind;
        part(next);
        std::mem::forget(abort_on_unwind);
        if shared.done.fetch_add(1, SeqCst) + 1 == parts && shared.caller_sleeping.load(SeqCst) {
            if let Some(caller) = &*shared.caller.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
                caller.unpark();
            }
        }
    }
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
    /// Call number, part count and next part (see `pack`); a new call
    /// number starts a call, and a part is taken by moving `next` on.
    claim: AtomicU64,
    /// Parts of the current call run to the end.
    done: AtomicUsize,
    /// Workers the current call may use (workers 1 to `helpers`).
    helpers: AtomicUsize,
    /// The current call's parts; written only while no part is running.
    job: UnsafeCell<Option<JobRef>>,
    caller: Mutex<Option<Thread>>,
    caller_sleeping: AtomicBool,
}

// SAFETY: `job` is written by the dispatching thread only while no part of
// a call runs (before `claim` announces the call, after `done` counts every part).
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
                claim: AtomicU64::new(0),
                done: AtomicUsize::new(0),
                helpers: AtomicUsize::new(0),
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
            let seen = self.shared.claim.load(SeqCst) >> CALL_SHIFT;
            let handle = std::thread::Builder::new()
                .name(format!("vllm-rs-kernel-{index}"))
                .spawn(move || work(&shared, index, seen, &worker_sleeping))
                .expect("starting a kernel worker thread");
            self.workers.push(Worker { thread: handle.thread().clone(), sleeping });
        }
    }
}

/// A worker's life: wait for a call, take parts of it if the call may use this worker.
fn work(shared: &Shared, index: usize, mut seen: u64, sleeping: &AtomicBool) {
    loop {
        seen = wait_for_call(shared, seen, sleeping);
        if index <= shared.helpers.load(SeqCst) {
            take_parts(shared, seen);
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

/// Spins, then sleeps, until a call after call number `seen`; its number.
fn wait_for_call(shared: &Shared, seen: u64, sleeping: &AtomicBool) -> u64 {
    let started = Instant::now();
    loop {
        let call = shared.claim.load(SeqCst) >> CALL_SHIFT;
        if call != seen {
            return call;
        }
        if started.elapsed() < WORKER_SPIN {
            pause(started);
            continue;
        }
        // Announce the sleep, then look once more: the caller sets `claim`
        // before it reads `sleeping`, so one of the two sees the other.
        sleeping.store(true, SeqCst);
        if shared.claim.load(SeqCst) >> CALL_SHIFT == seen {
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
        for (parts, threads) in [(1, 2), (2, 2), (3, 2), (5, 3), (8, 2), (2, 1), (4, 4), (16, 3)] {
            let counts: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..100 {
                run(parts, threads, &|p| {
                    counts[p].fetch_add(1, SeqCst);
                });
            }
            assert!(counts.iter().all(|c| c.load(SeqCst) == 100), "{parts} parts on {threads} threads: {counts:?}");
        }
    }

    #[test]
    fn calls_from_several_threads_at_once_each_run_every_part() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        run(6, 3, &|p| {
                            total.fetch_add(p + 1, SeqCst);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(SeqCst), 4 * 200 * (1 + 2 + 3 + 4 + 5 + 6));
    }

    #[test]
    fn sleeping_workers_are_woken() {
        let done = AtomicUsize::new(0);
        run(2, 2, &|_| {
            done.fetch_add(1, SeqCst);
        });
        // Past WORKER_SPIN the worker sleeps; the next call must still run.
        let until = Instant::now() + WORKER_SPIN * 5;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        run(2, 2, &|_| {
            done.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 4);
    }

    #[test]
    fn while_one_thread_is_held_up_the_other_takes_every_other_part() {
        // Whichever thread takes part 0 stays in it until the other seven
        // are done: only a pool whose threads take parts as they go (not
        // fixed halves) finishes the call. The deadline keeps a failure
        // from hanging the test.
        let others_done = AtomicUsize::new(0);
        let waited_for_all = AtomicBool::new(false);
        for _ in 0..20 {
            others_done.store(0, SeqCst);
            run(8, 2, &|p| {
                if p != 0 {
                    others_done.fetch_add(1, SeqCst);
                    return;
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                while others_done.load(SeqCst) < 7 && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                waited_for_all.store(others_done.load(SeqCst) == 7, SeqCst);
            });
            assert!(waited_for_all.load(SeqCst), "part 0 timed out waiting for the other parts");
        }
    }
}
