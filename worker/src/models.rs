//! Models a worker loads and unloads while it runs, beside the one it started with.
//!
//! A [`ModelCatalog`] names the models a directory holds (`--model-dir`): each `NAME.gguf` file
//! or Hugging Face directory `NAME/` is model `NAME`. [`LoadedModels`] keeps the models loaded
//! from it: each has its own engine on its own thread with its own KV cache (sized by the
//! worker's engine flags, as the start-up model's is). Loading builds the engine on a thread of
//! its own while the worker keeps serving; unloading refuses new requests for the model, lets
//! the running ones finish, then drops the engine — its weights and KV cache go back to the
//! operating system.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tandem_engine::LLMEngine;
use tandem_proto::v1 as pb;

use crate::engine_loop::EngineHandle;

/// The models a directory holds, by name.
#[derive(Debug, Clone, Default)]
pub struct ModelCatalog {
    dir: PathBuf,
}

/// Why a model cannot be loaded, served or unloaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    /// The name is not in the catalog.
    #[error("no model named {0:?} in the model directory")]
    NotInCatalog(String),
    /// The worker was started without a model directory.
    #[error("this worker has no model directory (--model-dir): it serves only its start-up model")]
    NoCatalog,
    /// The name is not loaded here.
    #[error("model {0:?} is not loaded on this worker")]
    NotLoaded(String),
    /// The model is loading or unloading.
    #[error("model {0:?} is {1}")]
    NotReady(String, &'static str),
    /// The start-up model stays.
    #[error(
        "model {0:?} is this worker's start-up model; only models loaded later can be unloaded"
    )]
    StartUpModel(String),
}

impl ModelCatalog {
    /// The catalog of `dir` (it must be a directory).
    pub fn open(dir: &Path) -> Result<ModelCatalog, String> {
        if !dir.is_dir() {
            return Err(format!("the model directory {} is not a directory", dir.display()));
        }
        Ok(ModelCatalog { dir: dir.to_path_buf() })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every model in the directory: name and path, by name.
    pub fn list(&self) -> BTreeMap<String, PathBuf> {
        let mut out = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return out };
        for e in entries.flatten() {
            let path = e.path();
            let file = e.file_name().to_string_lossy().into_owned();
            let name = if path.is_dir() {
                if !path.join("config.json").is_file() {
                    continue;
                }
                file
            } else if let Some(stem) = file.strip_suffix(".gguf") {
                stem.to_string()
            } else {
                continue;
            };
            if valid_name(&name) {
                out.insert(name, path);
            }
        }
        out
    }

    /// The path of model `name`.
    pub fn path(&self, name: &str) -> Result<PathBuf, ModelError> {
        if !valid_name(name) {
            return Err(ModelError::NotInCatalog(name.to_string()));
        }
        self.list().remove(name).ok_or_else(|| ModelError::NotInCatalog(name.to_string()))
    }
}

/// Names are file names without separators (no path tricks through a request).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 200
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Builds the engine of the model file at a path (the worker's engine flags), with a KV cache of
/// the given bytes when one is given.
pub type EngineFactory = Arc<dyn Fn(&Path, Option<u64>) -> anyhow::Result<LLMEngine> + Send + Sync>;

/// Parses `512MiB`, `2GiB`, `1.5GB`, `4096` (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("invalid size '{s}'"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1048576.0,
        "g" | "gb" => 1e9,
        "gib" => 1073741824.0,
        other => {
            return Err(format!(
                "invalid size unit '{other}' in '{s}' (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    Ok((v * mult) as u64)
}

#[derive(Clone)]
enum State {
    Loading,
    Ready(EngineHandle),
    Draining(EngineHandle),
    /// Drained; the engine is being dropped (still listed, as draining, until its memory is
    /// back).
    Freeing,
    Failed(String),
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Loading => "loading",
            State::Ready(_) => "ready",
            State::Draining(_) | State::Freeing => "draining",
            State::Failed(_) => "failed",
        }
    }
}

struct Slot {
    state: Mutex<State>,
    active: Arc<AtomicUsize>,
    max_model_len: AtomicUsize,
}

/// A request's hold on its model: the model is not unloaded until every hold is dropped.
pub struct ModelLease {
    active: Arc<AtomicUsize>,
}

impl Drop for ModelLease {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The models loaded after start-up.
pub struct LoadedModels {
    catalog: Option<ModelCatalog>,
    factory: EngineFactory,
    startup: String,
    drain_timeout: Duration,
    core_share: Option<PathBuf>,
    slots: Mutex<BTreeMap<String, Arc<Slot>>>,
}

impl std::fmt::Debug for LoadedModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModels")
            .field("catalog", &self.catalog)
            .field("startup", &self.startup)
            .finish_non_exhaustive()
    }
}

impl LoadedModels {
    /// Models from `catalog` built by `factory`, beside the start-up model `startup`; an unload
    /// waits up to `drain_timeout` for the model's requests, then fails the rest.
    pub fn new(
        catalog: Option<ModelCatalog>,
        factory: EngineFactory,
        startup: &str,
        drain_timeout: Duration,
    ) -> LoadedModels {
        LoadedModels {
            catalog,
            factory,
            startup: startup.to_string(),
            drain_timeout,
            core_share: None,
            slots: Mutex::new(BTreeMap::new()),
        }
    }

    /// Loaded models' engines take turns at the cores through this lock file too (the worker's
    /// `--core-share-lock`; see [`crate::core_share`]).
    pub fn with_core_share(mut self, path: Option<PathBuf>) -> LoadedModels {
        self.core_share = path;
        self
    }

    /// Starts loading `name` (on a thread of its own) with a KV cache of `kv_cache_bytes` (none:
    /// the worker's flags); the model's state now.
    pub fn load(
        self: &Arc<Self>,
        name: &str,
        kv_cache_bytes: Option<u64>,
    ) -> Result<pb::ModelState, ModelError> {
        if name == self.startup {
            return Ok(self.startup_state());
        }
        let catalog = self.catalog.as_ref().ok_or(ModelError::NoCatalog)?;
        let mut slots = self.slots.lock().expect("model slots lock");
        if let Some(s) = slots.get(name) {
            if !matches!(*s.state.lock().expect("model state lock"), State::Failed(_)) {
                return Ok(state_of(name, s));
            }
        }
        let path = catalog.path(name)?;
        let slot = Arc::new(Slot {
            state: Mutex::new(State::Loading),
            active: Arc::new(AtomicUsize::new(0)),
            max_model_len: AtomicUsize::new(0),
        });
        slots.insert(name.to_string(), slot.clone());
        drop(slots);
        let (factory, model) = (self.factory.clone(), name.to_string());
        let share_path = self.core_share.clone();
        std::thread::Builder::new()
            .name("model-load".into())
            .spawn(move || {
                let started = Instant::now();
                let share = share_path.as_deref().map(crate::core_share::CoreShare::open);
                let next = match (factory(&path, kv_cache_bytes), share.transpose()) {
                    (Ok(engine), Ok(share)) => {
                        slot.max_model_len.store(engine.max_model_len(), Ordering::Relaxed);
                        tracing::info!(model = %model, seconds = started.elapsed().as_secs_f64(), "model loaded");
                        State::Ready(EngineHandle::spawn_unlisted(engine, share))
                    }
                    (Ok(_), Err(e)) => {
                        tracing::error!(model = %model, error = %e, "opening the core-share lock failed");
                        State::Failed(format!("opening the core-share lock: {e}"))
                    }
                    (Err(e), _) => {
                        tracing::error!(model = %model, error = %e, "loading the model failed");
                        State::Failed(format!("{e:#}"))
                    }
                };
                *slot.state.lock().expect("model state lock") = next;
            })
            .expect("spawn the model loader");
        Ok(self.state(name).expect("just inserted"))
    }

    /// Starts unloading `name`: new requests are refused at once; after its requests finish
    /// (or `drain_timeout`), the engine is dropped and the model leaves the list.
    pub fn unload(self: &Arc<Self>, name: &str) -> Result<pb::ModelState, ModelError> {
        if name == self.startup {
            return Err(ModelError::StartUpModel(name.to_string()));
        }
        let slot = self.slot(name)?;
        let handle = {
            let mut st = slot.state.lock().expect("model state lock");
            match &*st {
                State::Ready(h) => {
                    let h = h.clone();
                    *st = State::Draining(h.clone());
                    Some(h)
                }
                State::Draining(_) | State::Freeing => return Ok(state_of(name, &slot)),
                State::Loading => return Err(ModelError::NotReady(name.to_string(), "loading")),
                State::Failed(_) => None,
            }
        };
        let Some(handle) = handle else {
            self.slots.lock().expect("model slots lock").remove(name);
            return Ok(pb::ModelState {
                model: name.to_string(),
                state: "draining".into(),
                ..Default::default()
            });
        };
        let (me, model, timeout) = (self.clone(), name.to_string(), self.drain_timeout);
        let out = state_of(name, &slot);
        tokio::spawn(async move {
            let started = Instant::now();
            while slot.active.load(Ordering::Acquire) > 0 && started.elapsed() < timeout {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let left = slot.active.load(Ordering::Acquire);
            if left > 0 {
                tracing::warn!(model = %model, requests = left, "drain timed out; failing the model's remaining requests");
                handle.call(|s| s.fail_all("the model was unloaded")).await;
            }
            let exited = handle.exited();
            drop(handle);
            // The slot held the last handle: the engine thread finishes and drops the engine.
            *slot.state.lock().expect("model state lock") = State::Freeing;
            while !exited.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            crate::process_metrics::return_free_memory();
            // Listed until here: a model gone from Status has given its memory back.
            me.slots.lock().expect("model slots lock").remove(&model);
            tracing::info!(model = %model, seconds = started.elapsed().as_secs_f64(), "model unloaded");
        });
        Ok(out)
    }

    /// The engine of `name` for one request, held until the lease is dropped; `None` for the
    /// start-up model.
    pub fn engine(&self, name: &str) -> Result<Option<(EngineHandle, ModelLease)>, ModelError> {
        if name.is_empty() || name == self.startup {
            return Ok(None);
        }
        let slot = self.slot(name)?;
        let st = slot.state.lock().expect("model state lock");
        match &*st {
            State::Ready(h) => {
                slot.active.fetch_add(1, Ordering::AcqRel);
                Ok(Some((h.clone(), ModelLease { active: slot.active.clone() })))
            }
            other => Err(ModelError::NotReady(name.to_string(), other.name())),
        }
    }

    /// Every engine a request id may live in (for aborts), start-up model excluded.
    pub fn engines(&self) -> Vec<EngineHandle> {
        let slots = self.slots.lock().expect("model slots lock");
        slots
            .values()
            .filter_map(|s| match &*s.state.lock().expect("model state lock") {
                State::Ready(h) | State::Draining(h) => Some(h.clone()),
                _ => None,
            })
            .collect()
    }

    /// The state of `name`, if it is loaded or loading.
    pub fn state(&self, name: &str) -> Option<pb::ModelState> {
        self.slot(name).ok().map(|s| state_of(name, &s))
    }

    /// The states of every model loaded after start-up.
    pub fn states(&self) -> Vec<pb::ModelState> {
        let slots = self.slots.lock().expect("model slots lock");
        slots.iter().map(|(n, s)| state_of(n, s)).collect()
    }

    fn startup_state(&self) -> pb::ModelState {
        pb::ModelState { model: self.startup.clone(), state: "ready".into(), ..Default::default() }
    }

    fn slot(&self, name: &str) -> Result<Arc<Slot>, ModelError> {
        self.slots
            .lock()
            .expect("model slots lock")
            .get(name)
            .cloned()
            .ok_or_else(|| ModelError::NotLoaded(name.to_string()))
    }
}

fn state_of(name: &str, s: &Slot) -> pb::ModelState {
    let st = s.state.lock().expect("model state lock");
    let (num_blocks, free_blocks) = match &*st {
        State::Ready(h) | State::Draining(h) => {
            let snap = h.snapshot();
            (snap.num_blocks as u32, snap.free_blocks as u32)
        }
        _ => (0, 0),
    };
    pb::ModelState {
        model: name.to_string(),
        state: st.name().into(),
        error: match &*st {
            State::Failed(e) => e.clone(),
            _ => String::new(),
        },
        active: s.active.load(Ordering::Acquire) as u32,
        num_blocks,
        free_blocks,
        max_model_len: s.max_model_len.load(Ordering::Relaxed) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_names_gguf_files_and_model_directories() {
        let dir = std::env::temp_dir().join(format!("tandem-catalog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("hf-model")).unwrap();
        std::fs::write(dir.join("hf-model/config.json"), "{}").unwrap();
        std::fs::create_dir_all(dir.join("not-a-model")).unwrap();
        std::fs::write(dir.join("small.Q4_1.gguf"), b"").unwrap();
        std::fs::write(dir.join("notes.txt"), b"").unwrap();
        let c = ModelCatalog::open(&dir).unwrap();
        let names: Vec<String> = c.list().into_keys().collect();
        assert_eq!(names, ["hf-model", "small.Q4_1"]);
        assert_eq!(c.path("small.Q4_1").unwrap(), dir.join("small.Q4_1.gguf"));
        assert_eq!(c.path("../etc").unwrap_err(), ModelError::NotInCatalog("../etc".into()));
        assert_eq!(c.path("missing").unwrap_err(), ModelError::NotInCatalog("missing".into()));
        assert!(ModelCatalog::open(&dir.join("small.Q4_1.gguf")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_are_checked_before_the_factory_runs() {
        let factory: EngineFactory = Arc::new(|_, _| anyhow::bail!("never called"));
        let m = Arc::new(LoadedModels::new(None, factory, "base", Duration::from_secs(1)));
        assert_eq!(m.load("other", None).unwrap_err(), ModelError::NoCatalog);
        assert_eq!(m.load("base", None).unwrap().state, "ready");
        assert_eq!(m.unload("base").unwrap_err(), ModelError::StartUpModel("base".into()));
        assert_eq!(m.unload("other").unwrap_err(), ModelError::NotLoaded("other".into()));
        assert!(m.engine("base").unwrap().is_none());
        assert!(m.engine("").unwrap().is_none());
        assert_eq!(m.engine("other").err(), Some(ModelError::NotLoaded("other".into())));
        assert!(m.states().is_empty());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
    }
}
