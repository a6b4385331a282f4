//! `ThreadPool`: the CPU backend's persistent workers for the many small parallel regions of a
//! forward pass (a decode step of the default model has about 150).
//!
//! A job's tasks are split into one contiguous range per thread. Each range is one atomic word
//! — `(epoch, end, next)` — on cache lines of its own: a thread claims tasks from its own range
//! by compare-and-swap, uncontended, and only when that is empty takes tasks from the others'
//! ranges, so a region costs a few cache-line transfers rather than one contended atomic per
//! task (on a 16-core host a shared claim counter made a small matmul's region cost ~25 µs).
//! The caller publishes the ranges, then the job's epoch in a word the workers watch; workers
//! spin on it for a short while, then park, so hand-off costs well under a microsecond while
//! the model runs and nothing while the process idles. A claim fails once its range belongs to
//! another job (the epoch in the word differs), so a late worker never runs a task of a job it
//! did not see published. The caller works too and returns when every *task* has finished,
//! never waiting for a worker that holds none: a worker descheduled by the OS (more threads
//! than free cores, a busy host) delays nobody unless it holds a task, and while one does, the
//! caller spins only briefly and then yields its core. Threads report their finished tasks once
//! per job. One job runs at a time (callers are serialised).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;

/// Spins before a worker parks (~tens of microseconds).
const SPIN_ITERS: u32 = 1 << 14;

/// Bits of a range's end and of its next-task index in its word; the epoch takes the rest.
const TASK_BITS: u32 = 20;
const TASK_MASK: u64 = (1 << TASK_BITS) - 1;
/// Most tasks one job may have (larger jobs are run in rounds).
const MAX_TASKS: usize = TASK_MASK as usize;
/// Epochs wrap within the bits a range word leaves them.
const EPOCH_MASK: u64 = u64::MAX >> (2 * TASK_BITS);

type Task = dyn Fn(usize) + Sync;

/// The fields of a range word: the job's epoch, the range's end and its next unclaimed task.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct JobWord {
    epoch: u64,
    end: usize,
    next: usize,
}

impl JobWord {
    fn pack(self) -> u64 {
        (self.epoch << (2 * TASK_BITS)) | ((self.end as u64) << TASK_BITS) | self.next as u64
    }
    fn unpack(w: u64) -> JobWord {
        JobWord {
            epoch: w >> (2 * TASK_BITS),
            end: ((w >> TASK_BITS) & TASK_MASK) as usize,
            next: (w & TASK_MASK) as usize,
        }
    }
}

/// An atomic word alone on its cache lines (two, against adjacent-line prefetching).
#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

struct Shared {
    /// The current job's epoch: what workers watch for new work.
    epoch: Padded,
    /// One task range per thread (workers first, the caller last).
    ranges: Vec<Padded>,
    /// The current job: a `&Task`, valid while any of its tasks is unfinished.
    job: AtomicU64,
    job_meta: AtomicU64,
    /// Tasks of the current job that have finished.
    done_tasks: AtomicUsize,
    sleeping: Vec<AtomicBool>,
}

impl Shared {
    /// Claims the next task of job `epoch` from range `r`, if it has one left; on success the
    /// current job is that one until the task is reported done.
    fn claim(&self, r: usize, epoch: u64) -> Option<usize> {
        let word = &self.ranges[r].0;
        let mut w = word.load(Ordering::Acquire);
        loop {
            let j = JobWord::unpack(w);
            if j.epoch != epoch || j.next >= j.end {
                return None;
            }
            match word.compare_exchange_weak(w, w + 1, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return Some(j.next),
                Err(now) => w = now,
            }
        }
    }

    /// Runs tasks of job `epoch` until none is left to claim: first from range `own`, then
    /// from the others in turn. Finished tasks are reported together at the end.
    fn work(&self, own: usize, epoch: u64) {
        let n = self.ranges.len();
        let mut done = 0;
        for k in 0..n {
            let r = (own + k) % n;
            while let Some(i) = self.claim(r, epoch) {
                // The job cannot change before this task is reported done, so it is the one
                // claimed.
                let f =
                    decode(self.job.load(Ordering::Relaxed), self.job_meta.load(Ordering::Relaxed));
                // SAFETY: `run` keeps the job alive until every task has been reported done.
                unsafe { (*f)(i) };
                done += 1;
            }
        }
        if done > 0 {
            self.done_tasks.fetch_add(done, Ordering::Release);
        }
    }
}

/// Raw output pointer shared by the threads of one parallel region; each writes a disjoint part.
pub(crate) struct OutPtr<T = f32>(pub(crate) *mut T);

impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}

impl<T> OutPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw pointer).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: the tasks of a region write disjoint parts (each user says which).
unsafe impl<T> Send for OutPtr<T> {}
unsafe impl<T> Sync for OutPtr<T> {}

/// Persistent worker threads.
pub struct ThreadPool {
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    lock: Mutex<()>,
}

fn encode(f: &Task) -> (u64, u64) {
    // SAFETY: a fat pointer is two words; it is decoded only while `run` keeps `f` alive.
    let raw: [usize; 2] =
        unsafe { std::mem::transmute::<*const Task, [usize; 2]>(f as *const Task) };
    (raw[0] as u64, raw[1] as u64)
}

fn decode(a: u64, b: u64) -> *const Task {
    // SAFETY: inverse of `encode`.
    unsafe { std::mem::transmute::<[usize; 2], *const Task>([a as usize, b as usize]) }
}

/// Physical cores available to this process: logical CPUs in its affinity mask (and cgroup
/// quota, as `available_parallelism` counts them), less SMT siblings when the topology says
/// so. Compute-bound threads gain nothing from a core's second hardware thread.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut cores = std::collections::HashSet::new();
    let mut seen = 0usize;
    if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") {
        for e in dir.flatten() {
            let name = e.file_name();
            let is_cpu = name
                .to_str()
                .and_then(|n| n.strip_prefix("cpu"))
                .is_some_and(|n| n.parse::<usize>().is_ok());
            if !is_cpu {
                continue;
            }
            let topo = e.path().join("topology");
            let read =
                |f: &str| std::fs::read_to_string(topo.join(f)).ok().map(|s| s.trim().to_string());
            if let (Some(pkg), Some(core)) = (read("physical_package_id"), read("core_id")) {
                cores.insert((pkg, core));
                seen += 1;
            }
        }
    }
    if cores.is_empty() || seen == 0 {
        return logical;
    }
    // Scale by the SMT ratio of the whole machine: the affinity mask may hold part of it.
    let smt = seen.div_ceil(cores.len()).max(1);
    logical.div_ceil(smt).max(1)
}

impl ThreadPool {
    /// A pool with `threads` threads in all (the caller counts as one).
    pub fn new(threads: usize) -> ThreadPool {
        let workers = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            epoch: Padded::default(),
            ranges: (0..=workers).map(|_| Padded::default()).collect(),
            job: AtomicU64::new(0),
            job_meta: AtomicU64::new(0),
            done_tasks: AtomicUsize::new(0),
            sleeping: (0..workers).map(|_| AtomicBool::new(false)).collect(),
        });
        let mut handles = Vec::with_capacity(workers);
        for w in 0..workers {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("tandem-cpu-{w}"))
                .spawn(move || worker(s, w))
                .expect("spawn CPU worker");
            handles.push(h.thread().clone());
        }
        ThreadPool { shared, threads: handles, lock: Mutex::new(()) }
    }

    /// The process-wide pool: `TANDEM_NUM_THREADS` threads, else one per physical core.
    pub fn global() -> &'static ThreadPool {
        static POOL: OnceLock<ThreadPool> = OnceLock::new();
        POOL.get_or_init(|| ThreadPool::new(Self::default_threads()))
    }

    /// `TANDEM_NUM_THREADS` if set to a positive number, else [`physical_cores`].
    pub fn default_threads() -> usize {
        std::env::var("TANDEM_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or_else(physical_cores)
    }

    /// Threads in all, the caller included.
    pub fn num_threads(&self) -> usize {
        self.threads.len() + 1
    }

    /// Runs `f(0..n_tasks)` across the pool and returns when all have finished.
    pub fn run<'a>(&self, n_tasks: usize, f: &'a (dyn Fn(usize) + Sync + 'a)) {
        if n_tasks == 0 {
            return;
        }
        if self.threads.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        if n_tasks > MAX_TASKS {
            for round in 0..n_tasks.div_ceil(MAX_TASKS) {
                let base = round * MAX_TASKS;
                self.run(MAX_TASKS.min(n_tasks - base), &|i| f(base + i));
            }
            return;
        }
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        super::profile::count_region(n_tasks);
        let s = &*self.shared;
        // SAFETY: workers call `f` only for tasks they claimed, and this function returns only
        // after every task has been reported done, so the erased lifetime is never outlived.
        let f_static: &'static Task =
            unsafe { std::mem::transmute::<&'a (dyn Fn(usize) + Sync + 'a), &'static Task>(f) };
        let (a, b) = encode(f_static);
        s.job.store(a, Ordering::Relaxed);
        s.job_meta.store(b, Ordering::Relaxed);
        s.done_tasks.store(0, Ordering::Relaxed);
        let epoch = s.epoch.0.load(Ordering::Relaxed).wrapping_add(1) & EPOCH_MASK;
        let n = s.ranges.len();
        for (r, range) in s.ranges.iter().enumerate() {
            let (start, end) = (r * n_tasks / n, (r + 1) * n_tasks / n);
            range.0.store(JobWord { epoch, end, next: start }.pack(), Ordering::Release);
        }
        // Publishes the job (the stores above happen before any worker sees the epoch).
        s.epoch.0.store(epoch, Ordering::SeqCst);
        for (i, t) in self.threads.iter().enumerate() {
            if s.sleeping[i].load(Ordering::SeqCst) {
                t.unpark();
            }
        }
        s.work(n - 1, epoch);
        // Spin briefly, then yield: when the cores are shared (a prefill and a decode worker on
        // one laptop), the thread still holding a task may be descheduled, and spinning would
        // keep it off the core for the rest of our time slice.
        let mut spins = 0u32;
        while s.done_tasks.load(Ordering::Acquire) < n_tasks {
            if spins < SPIN_ITERS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

fn worker(s: Arc<Shared>, index: usize) {
    // Epoch 0 is the pool's state before its first job: a worker that starts after that job
    // was published still joins it.
    let mut seen = 0;
    loop {
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.epoch.0.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            if spins < SPIN_ITERS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                s.sleeping[index].store(true, Ordering::SeqCst);
                if s.epoch.0.load(Ordering::SeqCst) == seen {
                    std::thread::park_timeout(std::time::Duration::from_millis(50));
                }
                s.sleeping[index].store(false, Ordering::SeqCst);
            }
        };
        seen = epoch;
        s.work(index, epoch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_task_exactly_once() {
        let pool = ThreadPool::new(3);
        for n in [1usize, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn every_task_once_with_more_threads_than_cores() {
        // Workers are preempted mid-claim here; a claim must never run a task of another job or
        // run one twice, and a job must not wait for a worker that holds no task.
        let pool = ThreadPool::new(8);
        let hits: Vec<AtomicUsize> = (0..13).map(|_| AtomicUsize::new(0)).collect();
        for job in 0..5000 {
            let n = 1 + job % 13;
            pool.run(n, &|i| {
                assert!(i < n, "task {i} of a job of {n}");
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        let total: usize = hits.iter().map(|h| h.load(Ordering::Relaxed)).sum();
        assert_eq!(total, (0..5000).map(|j| 1 + j % 13).sum::<usize>());
    }

    /// A thread that stays inside a task does not hold back the rest of its range: the first
    /// task of some range waits until every other task has run, which happens only if other
    /// threads take the second task of its range (without stealing, this job never ends; the
    /// wait gives up after a minute so that the failure is an assertion, not a hang).
    #[test]
    fn the_rest_of_a_busy_threads_range_is_taken_by_others() {
        let pool = ThreadPool::new(4);
        for _ in 0..50 {
            let n = 8; // two tasks per range
            let done = AtomicUsize::new(0);
            let blocker = AtomicBool::new(false);
            let waited_out = AtomicBool::new(false);
            pool.run(n, &|i| {
                if i % 2 == 0 && !blocker.swap(true, Ordering::AcqRel) {
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                    while done.load(Ordering::Acquire) < n - 1 {
                        if std::time::Instant::now() > deadline {
                            waited_out.store(true, Ordering::Release);
                            break;
                        }
                        std::thread::yield_now();
                    }
                }
                done.fetch_add(1, Ordering::AcqRel);
            });
            assert!(!waited_out.load(Ordering::Acquire), "a range's second task was never taken");
            assert_eq!(done.load(Ordering::Acquire), n);
        }
    }

    #[test]
    fn large_jobs_run_in_rounds() {
        let pool = ThreadPool::new(2);
        let n = MAX_TASKS + 5;
        let sum = AtomicU64::new(0);
        pool.run(n, &|i| {
            sum.fetch_add(i as u64, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), (n as u64 - 1) * n as u64 / 2);
    }

    #[test]
    fn job_word_round_trips() {
        let j = JobWord { epoch: EPOCH_MASK, end: MAX_TASKS, next: 17 };
        assert_eq!(JobWord::unpack(j.pack()), j);
        assert!(physical_cores() >= 1);
    }

    #[test]
    fn survives_idle_periods_and_concurrent_callers() {
        let pool = Arc::new(ThreadPool::new(2));
        std::thread::sleep(std::time::Duration::from_millis(120)); // workers park
        let total = Arc::new(AtomicUsize::new(0));
        let callers: Vec<_> = (0..3)
            .map(|_| {
                let (p, t) = (pool.clone(), total.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        p.run(4, &|_| {
                            t.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        assert_eq!(total.load(Ordering::Relaxed), 3 * 200 * 4);
    }
}

#[cfg(test)]
mod timing_probe {
    #[test]
    #[ignore = "prints hand-off latency; run manually with --ignored --nocapture"]
    fn handoff_latency() {
        let pool = super::ThreadPool::new(2);
        let t = std::time::Instant::now();
        let n = 100_000;
        for _ in 0..n {
            pool.run(2, &|_| {});
        }
        eprintln!("empty region: {:.2} us", t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
}
