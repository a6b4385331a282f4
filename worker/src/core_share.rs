//! Workers that share one host's cores take turns, a step at a time.
//!
//! A prefill and a decode worker on the same CPU cores (`tandem up` on a laptop) each run a
//! thread per core. Left alone, both pools spin on every core at once and each barrier waits
//! for threads the other process has pushed off their cores: both run at well under half
//! speed. With a shared lock file each engine step holds an exclusive `flock` on it, so one
//! worker at a time has every core, and a worker alone never waits.
//!
//! Turns are fair: a worker that finds the cores taken says so by holding a shared lock on a
//! second file (`<path>.want`) while it polls for them, and a worker that finishes a step
//! while someone wants the cores waits (up to [`HANDOFF`]) until they have been taken before
//! it asks again. Under load the workers alternate step by step, as one colocated engine
//! interleaves prefill and decode. The waiting worker polls (every [`POLL`]) instead of
//! blocking, so its engine thread keeps taking jobs (page writes, new requests, aborts)
//! meanwhile. The kernel drops a dead process's locks.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a worker waiting for its turn tries to take the cores.
pub const POLL: Duration = Duration::from_micros(200);

/// Longest a worker that finished a step waits for a waiting worker to take the cores.
pub const HANDOFF: Duration = Duration::from_millis(2);

/// Where a worker stands with the cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Not holding them, not waiting.
    Free,
    /// Waiting for them (holding the shared lock on the want file).
    Waiting,
    /// Holding them.
    Held,
}

/// A lock file that workers on the same cores hold around each step.
#[derive(Debug)]
pub struct CoreShare {
    cores: File,
    want: File,
    path: PathBuf,
    turn: Turn,
    /// A lock call failed (a file system without `flock`): steps run unshared.
    broken: bool,
}

fn open_lock(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(|e| {
        std::io::Error::new(e.kind(), format!("core-share lock file {}: {e}", path.display()))
    })
}

impl CoreShare {
    /// Opens (creating them if need be) the lock file at `path` and its `.want` companion; the
    /// error names the file.
    pub fn open(path: &Path) -> std::io::Result<CoreShare> {
        let mut want = path.as_os_str().to_owned();
        want.push(".want");
        Ok(CoreShare {
            cores: open_lock(path)?,
            want: open_lock(Path::new(&want))?,
            path: path.to_path_buf(),
            turn: Turn::Free,
            broken: false,
        })
    }

    fn give_up(&mut self, e: std::io::Error) {
        tracing::warn!(path = %self.path.display(), error = %e, "core-share lock failed; steps run unshared from now on");
        self.broken = true;
    }

    /// Whether this worker holds the cores now. If another worker holds them, this one is
    /// queued for the next turn: call again (after [`POLL`], serving other work meanwhile).
    pub fn poll(&mut self) -> bool {
        if self.broken || self.turn == Turn::Held {
            return true;
        }
        match self.cores.try_lock() {
            Ok(()) => {
                if self.turn == Turn::Waiting {
                    let _ = self.want.unlock();
                }
                self.turn = Turn::Held;
                true
            }
            Err(TryLockError::WouldBlock) => {
                if self.turn == Turn::Free {
                    // Blocks only while the holder checks the want file, an instant.
                    if let Err(e) = self.want.lock_shared() {
                        self.give_up(e);
                        return true;
                    }
                    self.turn = Turn::Waiting;
                }
                false
            }
            Err(TryLockError::Error(e)) => {
                self.give_up(e);
                true
            }
        }
    }

    /// Gives the cores back after a step (or stops waiting for them); when another worker
    /// waits, returns once it has taken them (or after [`HANDOFF`]). Returns whether one
    /// waited.
    pub fn release(&mut self) -> bool {
        match self.turn {
            Turn::Free => false,
            Turn::Waiting => {
                let _ = self.want.unlock();
                self.turn = Turn::Free;
                false
            }
            Turn::Held => {
                let _ = self.cores.unlock();
                self.turn = Turn::Free;
                let started = Instant::now();
                let mut waited = false;
                while self.someone_waits() && started.elapsed() < HANDOFF {
                    waited = true;
                    std::thread::sleep(POLL / 2);
                }
                waited
            }
        }
    }

    /// Whether another worker holds the want file (waits for the cores).
    fn someone_waits(&self) -> bool {
        match self.want.try_lock() {
            Ok(()) => {
                let _ = self.want.unlock();
                false
            }
            Err(TryLockError::WouldBlock) => true,
            Err(TryLockError::Error(_)) => false,
        }
    }
}

impl Drop for CoreShare {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    fn lock_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("tandem-core-share-{}-{name}", std::process::id()))
    }

    #[test]
    fn busy_workers_never_overlap_and_take_turns() {
        // flock locks belong to open file descriptions: two handles in one process exclude each
        // other just as two processes do.
        let path = lock_path("turns");
        let inside = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..2)
            .map(|who| {
                let (mut share, inside, order) =
                    (CoreShare::open(&path).unwrap(), inside.clone(), order.clone());
                std::thread::spawn(move || {
                    let mut handed = 0;
                    for _ in 0..40 {
                        while !share.poll() {
                            std::thread::sleep(POLL);
                        }
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        order.lock().unwrap().push(who);
                        std::thread::sleep(Duration::from_millis(2));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        handed += share.release() as usize;
                    }
                    handed
                })
            })
            .collect();
        let handed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 80);
        assert!(handed > 0, "two busy workers never waited for each other");
        // Without the handoff a worker that just released takes the cores straight back: a
        // handful of switches in 80 steps. With it they alternate.
        let switches = order.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(switches >= 20, "only {switches} switches in {order:?}");
        for p in [path.clone(), PathBuf::from(format!("{}.want", path.display()))] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn a_lone_worker_never_waits_and_a_waiter_gets_the_next_turn() {
        let path = lock_path("alone");
        let mut a = CoreShare::open(&path).unwrap();
        let mut b = CoreShare::open(&path).unwrap();
        for _ in 0..10 {
            assert!(a.poll());
            assert!(!a.release(), "nobody waited");
        }
        assert!(a.poll());
        assert!(!b.poll(), "a holds the cores");
        assert!(!b.poll());
        assert!(a.someone_waits());
        // a's release waits until b takes them, on another thread.
        let t = std::thread::spawn(move || {
            while !b.poll() {
                std::thread::sleep(POLL);
            }
            b
        });
        assert!(a.release());
        let mut b = t.join().unwrap();
        assert!(!a.poll(), "b holds the cores now");
        assert!(b.release(), "a was waiting");
        assert!(a.poll());
        assert!(!a.release(), "nobody waits any more");
        for p in [path.clone(), PathBuf::from(format!("{}.want", path.display()))] {
            let _ = std::fs::remove_file(p);
        }
    }
}
