//! Every step the engine thread runs, written to a file for a benchmark that asks where a served
//! run's time went (what `tandem bench engine`'s steps by kind say of an offline run).
//!
//! Off unless `TANDEM_STEP_LOG` names a file, or a directory (each process then writes
//! `steps-<pid>.jsonl` there: `tandem up`'s workers share the variable). The first line is `{"start_unix": S}` (the wall
//! clock when recording began, seconds); each line after it is one collected step's
//! [`StepRecord`](tandem_engine::llm_engine::step_trace::StepRecord) (times in seconds since
//! then) with the engine thread's own time before it (`idle`, `jobs`, `dispatch`, seconds).
//! `tandem bench engine` writes its run's steps in the same format (without the engine thread's
//! times) when the variable is set.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use tandem_engine::LLMEngine;

/// The environment variable naming the step log.
pub const ENV: &str = "TANDEM_STEP_LOG";

/// An open step log.
pub(crate) struct StepLog {
    out: BufWriter<File>,
}

impl StepLog {
    /// Opens the log `TANDEM_STEP_LOG` names (if any) and starts the engine's step records.
    /// A file that cannot be created is reported and recording stays off.
    pub(crate) fn from_env(engine: &mut LLMEngine) -> Option<StepLog> {
        StepLog::open(&path_from_env()?, engine)
    }

    /// Creates the log at `path` and starts the engine's step records.
    fn open(path: &std::path::Path, engine: &mut LLMEngine) -> Option<StepLog> {
        let file = match File::create(path) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = ?path, error = %e, "cannot create the step log");
                return None;
            }
        };
        engine.record_steps();
        let mut out = BufWriter::new(file);
        let _ = write_header(&mut out, SystemTime::now());
        Some(StepLog { out })
    }

    /// Appends the steps collected since the last call; `between` is the engine thread's time
    /// outside steps before the latest one (idle, jobs, dispatch).
    pub(crate) fn write(&mut self, engine: &mut LLMEngine, between: (f64, f64, f64)) {
        for r in engine.take_step_records() {
            let Ok(mut v) = serde_json::to_value(r) else { continue };
            if let Some(m) = v.as_object_mut() {
                m.insert("idle".into(), between.0.into());
                m.insert("jobs".into(), between.1.into());
                m.insert("dispatch".into(), between.2.into());
            }
            let _ = writeln!(self.out, "{v}");
        }
    }

    /// Writes out what is buffered (when the engine thread has nothing to run).
    pub(crate) fn flush(&mut self) {
        let _ = self.out.flush();
    }
}

/// Where a process's step log goes: the file `TANDEM_STEP_LOG` names, or `steps-<pid>.jsonl`
/// in the directory it names; `None` when it is not set.
pub fn path_from_env() -> Option<std::path::PathBuf> {
    let path = std::path::PathBuf::from(std::env::var_os(ENV)?);
    if path.is_dir() {
        // Several workers (tandem up) each write their own.
        return Some(path.join(format!("steps-{}.jsonl", std::process::id())));
    }
    Some(path)
}

/// The log's first line: when recording began, as Unix seconds.
fn write_header(out: &mut impl Write, started: SystemTime) -> std::io::Result<()> {
    let start = started.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    writeln!(out, "{{\"start_unix\":{start:.6}}}")
}

/// Writes the records of a finished offline run (`tandem bench engine`) to `path` in the log's
/// format; `started` is the wall clock when recording began.
pub fn write_records(
    path: &std::path::Path,
    started: SystemTime,
    records: &[tandem_engine::llm_engine::step_trace::StepRecord],
) -> std::io::Result<()> {
    let mut out = BufWriter::new(File::create(path)?);
    write_header(&mut out, started)?;
    for r in records {
        writeln!(out, "{}", serde_json::to_string(r).map_err(std::io::Error::other)?)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_engine::model_files::model_fetch::default_model_path;
    use tandem_engine::{EngineConfig, KvCacheSize, LoadOptions, Model, Prompt, SamplingParams};

    /// Every prompt token and decode row of a request appears in the log, one line a step.
    #[test]
    fn the_log_has_a_line_for_every_step() {
        let opts = LoadOptions { kv_cache: KvCacheSize::Tokens(512), ..Default::default() };
        let model = Model::load(&default_model_path().unwrap(), opts).unwrap();
        let mut e = LLMEngine::new(model, EngineConfig::default());
        let path =
            std::env::temp_dir().join(format!("tandem-step-log-{}.jsonl", std::process::id()));
        let mut log = StepLog::open(&path, &mut e).unwrap();
        let params = SamplingParams {
            temperature: 0.0,
            max_tokens: 5,
            ignore_eos: true,
            ..Default::default()
        };
        let prompt: Vec<u32> = (100..117).collect();
        e.add_request("a", Prompt::TokenIds(prompt.clone()), params, None).unwrap();
        let mut steps = 0;
        while e.has_unfinished_requests() {
            e.step().unwrap();
            steps += 1;
            log.write(&mut e, (0.0, 0.001, 0.002));
        }
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(lines[0]["start_unix"].as_f64().unwrap() > 1.6e9, "{}", lines[0]);
        let recs = &lines[1..];
        assert_eq!(recs.len(), steps, "{text}");
        let sum = |k: &str| recs.iter().map(|r| r[k].as_u64().unwrap()).sum::<u64>();
        assert_eq!(sum("prompt_tokens"), prompt.len() as u64);
        assert_eq!(sum("decode_rows"), 4, "the first token comes with the prompt's step");
        for r in recs {
            assert!(r["collected"].as_f64().unwrap() >= r["launched"].as_f64().unwrap(), "{r}");
            assert_eq!(r["jobs"].as_f64(), Some(0.001));
        }
    }
}
