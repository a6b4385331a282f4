//! `Tokenizer`: text <-> token ids, built from GGUF metadata (byte-level BPE) or from a
//! Hugging Face `tokenizer.json`.
//!
//! GGUF pre-tokenizer profiles are a closed table: an unknown `tokenizer.ggml.pre` is refused
//! rather than guessed, because a wrong guess silently changes token ids.

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::AddedToken;

use crate::model_files::gguf::{GgufFile, GgufValue};
use crate::LoadError;

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// A model's tokenizer with its special token ids.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Beginning-of-sequence token, when the model has one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Whether prompts get a BOS token prepended.
    pub add_bos_token: bool,
    special_ids: HashSet<u32>,
    /// No vocabulary at all ([`Tokenizer::ids_only`]).
    ids_only: bool,
    /// The same tokenizer with special-token text read as plain text (built on first use).
    plain: OnceLock<tokenizers::Tokenizer>,
    /// Most prompt bytes one token can stand for (computed on first use).
    max_bytes_per_token: OnceLock<usize>,
    /// Each token's output bytes, when they reproduce `decode` (checked on first use).
    pieces: OnceLock<Option<Pieces>>,
}

/// The bytes each token adds to the text after other text, by id (none for special tokens):
/// streaming detokenization appends them instead of decoding a window of tokens twice per
/// token. Only built for a tokenizer whose decoding is their concatenation
/// ([`Tokenizer::pieces`]).
#[derive(Debug)]
pub struct Pieces {
    bytes: Vec<Box<[u8]>>,
}

impl Pieces {
    /// The bytes token `id` adds (empty for a special token or an id out of range).
    pub fn get(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], |b| &b[..])
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

fn strings(f: &GgufFile, key: &str) -> Result<Vec<String>, LoadError> {
    let arr = f
        .get(key)
        .and_then(|v| v.as_array())
        .ok_or_else(|| LoadError::Tokenizer(format!("GGUF metadata lacks array '{key}'")))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| LoadError::Tokenizer(format!("'{key}' holds a non-string")))
        })
        .collect()
}

fn token_id(f: &GgufFile, key: &str) -> Option<u32> {
    f.get(key).and_then(GgufValue::as_u64).map(|v| v as u32)
}

impl Tokenizer {
    /// Builds the tokenizer described by GGUF metadata (`tokenizer.ggml.*`).
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, LoadError> {
        let model = f.get("tokenizer.ggml.model").and_then(|v| v.as_str()).unwrap_or("");
        let tokens = strings(f, "tokenizer.ggml.tokens")?;
        let types: Vec<u64> = match f.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()) {
            Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        };
        let mut inner = match model {
            "gpt2" => byte_level_bpe(f, &tokens)?,
            "llama" => {
                let scores: Vec<f32> = f
                    .get("tokenizer.ggml.scores")
                    .and_then(|v| v.as_array())
                    .ok_or_else(|| LoadError::Tokenizer("GGUF lacks tokenizer.ggml.scores".into()))?
                    .iter()
                    .map(|v| v.as_f64().unwrap_or(0.0) as f32)
                    .collect();
                let unk = token_id(f, "tokenizer.ggml.unknown_token_id")
                    .and_then(|i| tokens.get(i as usize))
                    .map(String::as_str);
                let prefix = f
                    .get("tokenizer.ggml.add_space_prefix")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(true);
                crate::model_files::spm::tokenizer(&tokens, &scores, &types, unk, prefix)?
            }
            other => {
                return Err(LoadError::Tokenizer(format!(
                    "tokenizer model '{other}' is not supported (supported: gpt2 byte-level BPE, llama SentencePiece)"
                )))
            }
        };
        let mut special_ids = HashSet::new();
        let mut added = Vec::new();
        for (i, (t, ty)) in tokens.iter().zip(&types).enumerate() {
            // The added token's text must be its vocabulary piece, or it gets a new id.
            let t = if model == "llama" { crate::model_files::spm::piece(t) } else { t.clone() };
            match *ty {
                TOKEN_TYPE_CONTROL => {
                    special_ids.insert(i as u32);
                    added.push(AddedToken::from(t, true));
                }
                TOKEN_TYPE_USER_DEFINED => added.push(AddedToken::from(t, false)),
                _ => {}
            }
        }
        inner
            .add_special_tokens(added)
            .map_err(|e| LoadError::Tokenizer(format!("special tokens: {e}")))?;
        let bos = token_id(f, "tokenizer.ggml.bos_token_id");
        let eos = token_id(f, "tokenizer.ggml.eos_token_id");
        let eot = token_id(f, "tokenizer.ggml.eot_token_id");
        let eos_token_ids: Vec<u32> =
            eos.into_iter().chain(eot.filter(|t| Some(*t) != eos)).collect();
        for id in bos.iter().chain(&eos_token_ids) {
            if *id as usize >= tokens.len() {
                return Err(LoadError::Tokenizer(format!(
                    "special token id {id} is outside the vocabulary"
                )));
            }
        }
        Ok(Tokenizer {
            inner,
            bos_token_id: bos,
            eos_token_ids,
            add_bos_token: f
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            special_ids,
            ids_only: false,
            plain: OnceLock::new(),
            max_bytes_per_token: OnceLock::new(),
            pieces: OnceLock::new(),
        })
    }

    /// Loads `tokenizer.json` (and special ids from `tokenizer_config.json` / `config.json`) from
    /// a Hugging Face model directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, LoadError> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| LoadError::Tokenizer(format!("{}: {e}", path.display())))?;
        let cfg = read_json(&dir.join("tokenizer_config.json"));
        let model_cfg = read_json(&dir.join("config.json"));
        let special_ids: HashSet<u32> = inner
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let id_of_cfg_token = |key: &str| -> Option<u32> {
            let v = cfg.get(key)?;
            let s = v.as_str().or_else(|| v.get("content").and_then(|c| c.as_str()))?;
            inner.token_to_id(s)
        };
        let bos_token_id = id_of_cfg_token("bos_token")
            .or_else(|| model_cfg.get("bos_token_id").and_then(|v| v.as_u64()).map(|v| v as u32));
        let mut eos_token_ids: Vec<u32> = id_of_cfg_token("eos_token").into_iter().collect();
        match model_cfg.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => {
                eos_token_ids.extend(n.as_u64().map(|v| v as u32))
            }
            Some(serde_json::Value::Array(a)) => {
                eos_token_ids.extend(a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32))
            }
            _ => {}
        }
        eos_token_ids.dedup();
        let mut seen = HashSet::new();
        eos_token_ids.retain(|t| seen.insert(*t));
        Ok(Tokenizer {
            inner,
            bos_token_id,
            eos_token_ids,
            add_bos_token: cfg.get("add_bos_token").and_then(|v| v.as_bool()).unwrap_or(false),
            special_ids,
            ids_only: false,
            plain: OnceLock::new(),
            max_bytes_per_token: OnceLock::new(),
            pieces: OnceLock::new(),
        })
    }

    /// A tokenizer with no vocabulary, for models loaded without one (random weights of a bare
    /// configuration): prompts must be token ids and outputs are not detokenized.
    pub fn ids_only() -> Tokenizer {
        let model = tokenizers::models::wordlevel::WordLevel::default();
        Tokenizer {
            inner: tokenizers::Tokenizer::new(model),
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            add_bos_token: false,
            special_ids: HashSet::new(),
            ids_only: true,
            plain: OnceLock::new(),
            max_bytes_per_token: OnceLock::new(),
            pieces: OnceLock::new(),
        }
    }

    /// Whether this is [`Tokenizer::ids_only`]: text can be neither encoded nor decoded.
    pub fn is_ids_only(&self) -> bool {
        self.ids_only
    }

    /// Number of entries in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encodes text; special tokens written in the text are recognised. When `add_special` is
    /// set and the model asks for it, a BOS token is prepended.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizeError> {
        if self.ids_only {
            return Err(TokenizeError(
                "this model was loaded without a tokenizer: send token ids, not text".into(),
            ));
        }
        let enc = self.inner.encode_fast(text, false).map_err(|e| TokenizeError(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.get_ids().len() + 1);
        if add_special && self.add_bos_token {
            ids.extend(self.bos_token_id);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Encodes text with special-token text read as plain text: `<|im_end|>` written by a user
    /// becomes the tokens of those characters, never the control token. No BOS is added.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        if self.ids_only {
            return Err(TokenizeError(
                "this model was loaded without a tokenizer: send token ids, not text".into(),
            ));
        }
        let plain = self.plain.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        Ok(plain
            .encode_fast(text, false)
            .map_err(|e| TokenizeError(e.to_string()))?
            .get_ids()
            .to_vec())
    }

    /// The text of every special (control) token, e.g. `<|im_start|>`.
    pub fn special_texts(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .special_ids
            .iter()
            .filter_map(|&id| self.inner.id_to_token(id))
            .filter(|t| !t.is_empty())
            .collect();
        v.sort();
        v
    }

    /// An upper bound on the bytes of text one token stands for, so that a text longer than
    /// `tokens * max_bytes_per_token()` cannot fit in `tokens` tokens and can be refused
    /// without tokenizing it. Byte-level BPE maps each text byte to one vocabulary character,
    /// so a token's vocabulary string has at least as many UTF-8 bytes as the text it covers;
    /// a tokenizer with a normalizer (which may shrink text) gets a fourfold margin.
    pub fn max_bytes_per_token(&self) -> usize {
        *self.max_bytes_per_token.get_or_init(|| {
            let longest =
                self.inner.get_vocab(true).keys().map(String::len).max().unwrap_or(1).max(1);
            if self.inner.get_normalizer().is_some() {
                longest * 4
            } else {
                longest
            }
        })
    }

    /// Decodes ids to text. Invalid UTF-8 (an incomplete character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizeError> {
        self.inner.decode(ids, skip_special).map_err(|e| TokenizeError(e.to_string()))
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// The token string for an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The bytes of text each token stands for, by id (empty for an id with no text and for
    /// special tokens, whose text is not output text). Byte-level BPE maps every vocabulary
    /// character back to the byte it encodes; SentencePiece vocabularies write a space as `▁`
    /// and single bytes as `<0xNN>`. A token may hold part of a UTF-8 character, which is why
    /// this is bytes and not text (constrained decoding walks the vocabulary byte by byte).
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let n = self.vocab_size();
        let mut out = vec![Vec::new(); n];
        if self.ids_only {
            return out;
        }
        let added = self.inner.get_added_tokens_decoder();
        let byte_level = self.inner.get_decoder().is_some_and(decoder_is_byte_level);
        let unicode_to_byte = byte_level_map();
        for (id, bytes) in out.iter_mut().enumerate() {
            let id = id as u32;
            if self.special_ids.contains(&id) {
                continue;
            }
            if let Some(t) = added.get(&id) {
                *bytes = match byte_level {
                    true => t.content.clone().into_bytes(),
                    false => t.content.replace('\u{2581}', " ").into_bytes(),
                };
                continue;
            }
            let Some(piece) = self.inner.id_to_token(id) else { continue };
            *bytes = if byte_level {
                match piece.chars().map(|c| unicode_to_byte.get(&c).copied()).collect() {
                    Some(b) => b,
                    None => piece.into_bytes(),
                }
            } else if let Some(b) = byte_piece(&piece) {
                vec![b]
            } else {
                piece.replace('\u{2581}', " ").into_bytes()
            };
        }
        out
    }
}

impl Tokenizer {
    /// The token byte table ([`Pieces`]) when decoding a token after any text appends exactly
    /// its bytes with special tokens skipped; `None` when it does not (a decoder that rewrites
    /// text across tokens), and then streaming decodes windows of tokens. Built and checked on
    /// first use: thousands of random four-token runs after a one-letter token, each decoded
    /// both ways (runs whose bytes are not whole UTF-8 characters are skipped).
    pub fn pieces(&self) -> Option<&Pieces> {
        self.pieces
            .get_or_init(|| {
                if self.ids_only {
                    return None;
                }
                let bytes = self.token_bytes();
                let table =
                    Pieces { bytes: bytes.into_iter().map(Vec::into_boxed_slice).collect() };
                self.pieces_match_decoding(&table).then_some(table)
            })
            .as_ref()
    }

    fn pieces_match_decoding(&self, table: &Pieces) -> bool {
        let n = table.bytes.len() as u64;
        let Some(anchor) = (0..n as u32).find(|&i| table.get(i) == b"a") else { return false };
        let Ok(before) = self.decode(&[anchor], true) else { return false };
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n) as u32
        };
        let mut checked = 0;
        for _ in 0..4000 {
            let run = [anchor, next(), next(), next(), next()];
            let joined: Vec<u8> = run[1..].iter().flat_map(|&i| table.get(i).to_vec()).collect();
            let Ok(text) = std::str::from_utf8(&joined) else { continue };
            match self.decode(&run, true) {
                Ok(full) if full.strip_prefix(before.as_str()) == Some(text) => checked += 1,
                _ => return false,
            }
        }
        checked >= 500
    }
}

/// GPT-2's byte-level alphabet read backwards: the printable bytes `!`..=`~`, `¡`..=`¬`,
/// `®`..=`ÿ` are written as the character of the same code, the other 68 bytes, in increasing
/// order, as U+0100 onwards.
fn byte_level_map() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (b as char, b)
            } else {
                next += 1;
                (char::from_u32(next - 1).expect("below U+0200"), b)
            }
        })
        .collect()
}

/// `<0xNN>`, SentencePiece's piece for one raw byte.
fn byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// Whether a decoder (or a sequence holding one) undoes GPT-2's byte-to-character mapping.
fn decoder_is_byte_level(d: &tokenizers::DecoderWrapper) -> bool {
    match d {
        tokenizers::DecoderWrapper::ByteLevel(_) => true,
        tokenizers::DecoderWrapper::Sequence(s) => {
            s.get_decoders().iter().any(decoder_is_byte_level)
        }
        _ => false,
    }
}

/// The byte-level BPE of GGUF `tokenizer.ggml.model = "gpt2"`: vocabulary, merges and the
/// pre-tokenizer of the file's `tokenizer.ggml.pre` profile.
fn byte_level_bpe(f: &GgufFile, tokens: &[String]) -> Result<tokenizers::Tokenizer, LoadError> {
    let pre = f.get("tokenizer.ggml.pre").and_then(|v| v.as_str()).unwrap_or("default");
    let pre_tokenizer = pre_tokenizer_for(pre)?;
    let merges: Vec<(String, String)> = strings(f, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| LoadError::Tokenizer(format!("merge '{m}' has no space")))
        })
        .collect::<Result<_, _>>()?;
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| LoadError::Tokenizer(format!("cannot build BPE: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(ByteLevel::default()));
    Ok(inner)
}

fn read_json(path: &Path) -> serde_json::Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// The pre-tokenizer of a GGUF `tokenizer.ggml.pre` profile.
fn pre_tokenizer_for(pre: &str) -> Result<PreTokenizerWrapper, LoadError> {
    let byte_level = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    match pre {
        // GPT-2's regex alone.
        "gpt2" | "default" => Ok(byte_level()),
        // SmolLM: each digit is its own piece, then GPT-2's regex.
        "smollm" => Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            byte_level(),
        ]))),
        other => Err(LoadError::Tokenizer(format!(
            "GGUF pre-tokenizer profile '{other}' is not supported (supported: gpt2, default, smollm)"
        ))),
    }
}

/// Tokenization failed.
#[derive(Debug, thiserror::Error)]
#[error("tokenization failed: {0}")]
pub struct TokenizeError(pub String);
