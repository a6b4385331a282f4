//! `ThreadPool`: the CPU backend's persistent workers for the many small parallel regions of a
//! forward pass (a decode step of the default model has about 150).
//!
//! The caller publishes a job by bumping an epoch; workers spin on it for a short while, then
//! park, so hand-off costs well under a microsecond while the model runs and nothing while the
//! process idles. Tasks are claimed from an atomic counter; the caller works too and returns
//! when every task has finished. One job runs at a time (callers are serialised).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;

/// Spins before a worker parks (~tens of microseconds).
const SPIN_ITERS: u32 = 1 << 14;

type Task = dyn Fn(usize) + Sync;

struct Shared {
    epoch: AtomicU64,
    /// The current job: a `&Task` valid until every worker reports done.
    job: AtomicU64,
    job_meta: AtomicU64,
    n_tasks: AtomicUsize,
    next: AtomicUsize,
    done_workers: AtomicUsize,
    sleeping: Vec<AtomicBool>,
}

/// Persistent worker threads.
pub struct ThreadPool {
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    lock: Mutex<()>,
}

fn encode(f: &Task) -> (u64, u64) {
    // SAFETY: a fat pointer is two words; it is decoded only while `run` keeps `f` alive.
    let raw: [usize; 2] = unsafe { std::mem::transmute::<*const Task, [usize; 2]>(f as *const Task) };
    (raw[0] as u64, raw[1] as u64)
}

fn decode(a: u64, b: u64) -> *const Task {
    // SAFETY: inverse of `encode`.
    unsafe { std::mem::transmute::<[usize; 2], *const Task>([a as usize, b as usize]) }
}

impl ThreadPool {
    /// A pool with `threads` threads in all (the caller counts as one).
    pub fn new(threads: usize) -> ThreadPool {
        let workers = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicU64::new(0),
            job_meta: AtomicU64::new(0),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            done_workers: AtomicUsize::new(0),
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

    /// The process-wide pool: `TANDEM_NUM_THREADS` threads, else one per available core.
    pub fn global() -> &'static ThreadPool {
        static POOL: OnceLock<ThreadPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let n = std::env::var("TANDEM_NUM_THREADS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
            ThreadPool::new(n)
        })
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
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let s = &*self.shared;
        // SAFETY: the workers use `f` only until `done_workers` says they finished, which this
        // function waits for before returning, so the erased lifetime is never outlived.
        let f_static: &'static Task = unsafe { std::mem::transmute::<&'a (dyn Fn(usize) + Sync + 'a), &'static Task>(f) };
        let (a, b) = encode(f_static);
        s.job.store(a, Ordering::Relaxed);
        s.job_meta.store(b, Ordering::Relaxed);
        s.n_tasks.store(n_tasks, Ordering::Relaxed);
        s.next.store(0, Ordering::Relaxed);
        s.done_workers.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        for (i, t) in self.threads.iter().enumerate() {
            if s.sleeping[i].load(Ordering::SeqCst) {
                t.unpark();
            }
        }
        loop {
            let i = s.next.fetch_add(1, Ordering::Relaxed);
            if i >= n_tasks {
                break;
            }
            f(i);
        }
        while s.done_workers.load(Ordering::Acquire) < self.threads.len() {
            std::hint::spin_loop();
        }
    }
}

fn worker(s: Arc<Shared>, index: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            if spins < SPIN_ITERS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                s.sleeping[index].store(true, Ordering::SeqCst);
                if s.epoch.load(Ordering::SeqCst) == seen {
                    std::thread::park_timeout(std::time::Duration::from_millis(50));
                }
                s.sleeping[index].store(false, Ordering::SeqCst);
            }
        };
        seen = epoch;
        let f = decode(s.job.load(Ordering::Relaxed), s.job_meta.load(Ordering::Relaxed));
        let n = s.n_tasks.load(Ordering::Relaxed);
        loop {
            let i = s.next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            // SAFETY: `run` keeps the job alive until this worker reports done below.
            unsafe { (*f)(i) };
        }
        s.done_workers.fetch_add(1, Ordering::Release);
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
