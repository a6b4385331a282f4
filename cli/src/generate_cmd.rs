//! `tandem generate`: one prompt through a local model, streamed to stdout or as JSON.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tandem_engine::sampling::sampler::TokenLogprob;
use tandem_engine::{model_files::model_fetch, ChatMessage, Prompt, SamplingParams};

/// Arguments of `tandem generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Model file (.gguf) or Hugging Face directory; default: SmolLM2-135M-Instruct, fetched
    /// into the cache on first use.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt text; read from stdin when absent.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Treat the prompt as one user message rendered through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed for sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating after an end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Report this many most likely alternatives for each generated token.
    #[arg(long, default_value_t = 0)]
    pub top_logprobs: usize,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: crate::engine_args::EngineArgs,
}

#[derive(Serialize)]
struct JsonLogprob {
    token_id: u32,
    logprob: f32,
    top: Vec<TokenLogprob>,
}

#[derive(Serialize)]
struct JsonOutput {
    prompt_token_ids: Vec<u32>,
    token_ids: Vec<u32>,
    text: String,
    finish_reason: tandem_engine::FinishReason,
    logprobs: Vec<JsonLogprob>,
}

/// Resolves `--model`, fetching the default model when none is given.
pub fn model_path(arg: Option<PathBuf>) -> Result<PathBuf> {
    match arg {
        Some(p) => Ok(p),
        None => Ok(model_fetch::default_model_path()?),
    }
}

/// Runs `tandem generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    let prompt = match a.prompt {
        Some(p) => p,
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("reading the prompt from stdin")?;
            s
        }
    };
    if prompt.is_empty() {
        bail!("the prompt is empty (pass --prompt TEXT or pipe it on stdin)");
    }
    let path = model_path(a.model)?;
    let model =
        a.engine.load_model(&path).with_context(|| format!("loading {}", path.display()))?;
    let text = if a.chat {
        model.apply_chat_template(&[ChatMessage::new("user", &prompt)])?
    } else {
        prompt
    };
    let prompt_ids = model.tokenizer.encode(&text, true)?;
    let params = SamplingParams {
        temperature: a.temperature,
        max_tokens: a.max_tokens,
        ignore_eos: a.ignore_eos,
        seed: a.seed,
        logprobs: if a.json || a.top_logprobs > 0 { Some(a.top_logprobs) } else { None },
        ..Default::default()
    };
    let mut engine = a.engine.build_engine(model)?;
    let stdout = std::io::stdout();
    let out = if a.json {
        engine.generate(Prompt::TokenIds(prompt_ids), params, &mut |_| {})?
    } else {
        let mut lock = stdout.lock();
        let g = engine.generate(Prompt::TokenIds(prompt_ids), params, &mut |piece| {
            let _ = lock.write_all(piece.as_bytes());
            let _ = lock.flush();
        })?;
        let _ = writeln!(lock);
        g
    };
    if a.json {
        let j = JsonOutput {
            prompt_token_ids: out.prompt_token_ids,
            token_ids: out.token_ids,
            text: out.text,
            finish_reason: out.finish_reason,
            logprobs: out
                .logprobs
                .into_iter()
                .map(|s| JsonLogprob {
                    token_id: s.chosen.token_id,
                    logprob: s.chosen.logprob,
                    top: s.top,
                })
                .collect(),
        };
        println!("{}", serde_json::to_string(&j)?);
    } else if a.top_logprobs > 0 {
        for (i, s) in out.logprobs.iter().enumerate() {
            let alts: Vec<String> =
                s.top.iter().map(|t| format!("{}:{:.3}", t.token_id, t.logprob)).collect();
            eprintln!("[{i}] {} {:.4} | {}", s.chosen.token_id, s.chosen.logprob, alts.join(" "));
        }
    }
    Ok(())
}
