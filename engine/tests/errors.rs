//! Every way a model file can be wrong gives a typed error that says what is wrong — never a
//! panic: truncated or corrupt GGUF, unknown tensor types, unsupported architectures and
//! tokenizers, missing or misshapen tensors, bad chat templates, bad safetensors.

use std::path::{Path, PathBuf};

use tandem_engine::backend::{BackendError, ForwardBatch, Logits};
use tandem_engine::model_files::gguf::GgufWriter;
use tandem_engine::{ChatMessage, LoadError, LoadOptions, Model, TemplateError};

mod common;
use common::VOCAB;

const H: u64 = 32; // hidden
const FF: u64 = 64;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-errors-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A tiny but complete Llama GGUF with f32 weights; `edit` may change it before it is written.
fn tiny_gguf(name: &str, edit: impl FnOnce(&mut GgufWriter)) -> PathBuf {
    let mut w = common::tiny_llama(H, FF, |_, n, k| {
        let v = common::small_f32(n * k);
        (0, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    });
    edit(&mut w);
    let p = tmp(name);
    std::fs::write(&p, w.build()).unwrap();
    p
}

fn load(p: &Path) -> Result<Model, LoadError> {
    Model::load(p, LoadOptions::with_kv_tokens(64))
}

fn err(p: &Path) -> String {
    match load(p) {
        Ok(_) => panic!("{} loaded", p.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tiny_model_loads_and_runs() {
    let mut m = load(&tiny_gguf("ok.gguf", |_| {})).unwrap();
    let table: Vec<u32> = (0..4).collect();
    let mut b = ForwardBatch::default();
    b.push_seq(&[0, 5, 7], 0, &table, 16, Logits::Last);
    let logits = m.backend.forward(&b).unwrap();
    assert_eq!(logits.len(), VOCAB as usize);
    assert!(logits.iter().all(|x| x.is_finite()));
}

#[test]
fn truncated_gguf_is_reported_at_every_cut() {
    let full = std::fs::read(tiny_gguf("full.gguf", |_| {})).unwrap();
    let p = tmp("cut.gguf");
    for cut in (0..full.len()).step_by(97).chain([full.len() - 1]) {
        std::fs::write(&p, &full[..cut]).unwrap();
        let e = err(&p);
        assert!(
            e.contains("truncated") || e.contains("magic") || e.contains("corrupt"),
            "cut {cut}: {e}"
        );
    }
}

#[test]
fn garbage_and_missing_files() {
    let p = tmp("garbage.gguf");
    std::fs::write(&p, b"this is not a model at all, just text").unwrap();
    assert!(err(&p).contains("bad magic"));
    let e = err(Path::new("/nonexistent/model.gguf"));
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
    let p = tmp("model.bin");
    std::fs::write(&p, b"0123").unwrap();
    assert!(err(&p).contains("cannot tell the model format"));
}

#[test]
fn unknown_tensor_type_names_tensor_and_type() {
    // IQ4_XS (id 23, 136 bytes per 256 weights) is not loaded.
    let p = tiny_gguf("iq4xs.gguf", |w| {
        w.tensor("blk.0.extra.weight", &[256, 2], 23, vec![0; 272]);
    });
    let e = err(&p);
    assert!(e.contains("blk.0.extra.weight") && e.contains("IQ4_XS"), "{e}");
    assert!(e.contains("supported: F32, F16, BF16") && e.contains("Q4_K"), "{e}");
}

#[test]
fn unsupported_architecture_and_tokenizer() {
    let p = tiny_gguf("arch.gguf", |w| {
        w.str("general.architecture", "mamba");
    });
    assert!(err(&p).contains("unsupported model architecture 'mamba'"));
    let p = tiny_gguf("pre.gguf", |w| {
        w.str("tokenizer.ggml.pre", "mystery");
    });
    let e = err(&p);
    assert!(e.contains("pre-tokenizer profile 'mystery'"), "{e}");
    let p = tiny_gguf("rwkv.gguf", |w| {
        w.str("tokenizer.ggml.model", "rwkv");
    });
    let e = err(&p);
    assert!(e.contains("tokenizer model 'rwkv'") && e.contains("llama SentencePiece"), "{e}");
    // A SentencePiece vocabulary needs its scores.
    let p = tiny_gguf("spm.gguf", |w| {
        w.str("tokenizer.ggml.model", "llama");
    });
    let e = err(&p);
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
}

#[test]
fn missing_and_misshapen_tensors() {
    let mut p = tiny_gguf("no-ffn.gguf", |_| {});
    // Rename a tensor so the architecture's tensor is absent.
    let mut bytes = std::fs::read(&p).unwrap();
    let needle = b"blk.0.ffn_up.weight";
    let at = bytes.windows(needle.len()).position(|w| w == needle).unwrap();
    bytes[at + 6] = b'X';
    p = tmp("no-ffn2.gguf");
    std::fs::write(&p, bytes).unwrap();
    assert!(err(&p).contains("lacks tensor 'blk.0.ffn_up.weight'"));
    let p = tiny_gguf("shape.gguf", |w| {
        w.u32("llama.feed_forward_length", 96);
    });
    let e = err(&p);
    assert!(e.contains("shape") && e.contains("blk.0.ffn_gate.weight"), "{e}");
}

#[test]
fn bad_chat_template_is_reported() {
    let p = tiny_gguf("tmpl.gguf", |w| {
        w.str("tokenizer.chat_template", "{% for m in messages %}{{ m.content ");
    });
    let e = load(&p).unwrap_err();
    assert!(matches!(e, LoadError::Template(TemplateError::Syntax(_))), "{e}");
    assert!(e.to_string().contains("chat template does not compile"));

    let p = tiny_gguf("tmpl-raise.gguf", |w| {
        w.str(
            "tokenizer.chat_template",
            "{% if messages|length > 1 %}{{ raise_exception('only one message') }}{% endif %}x",
        );
    });
    let m = load(&p).unwrap();
    let two = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    let e = m.apply_chat_template(&two).unwrap_err();
    assert!(e.to_string().contains("only one message"), "{e}");
}

#[test]
fn bad_batches_are_refused_not_panicking() {
    let mut m = load(&tiny_gguf("batch.gguf", |_| {})).unwrap();
    let table: Vec<u32> = (0..4).collect();
    let mut b = ForwardBatch::default();
    b.push_seq(&[VOCAB as u32 + 3], 0, &table, 16, Logits::Last);
    assert!(
        matches!(m.backend.forward(&b), Err(BackendError::InvalidBatch(e)) if e.contains("outside the vocabulary"))
    );
    let mut b = ForwardBatch::default();
    b.push_seq(&[1, 2], 0, &[99], 16, Logits::Last);
    assert!(m.backend.forward(&b).is_err());
    let mut b = ForwardBatch::default();
    b.push_seq(&[1; 20], 0, &[0], 16, Logits::Last); // 20 tokens, one 16-token block
    assert!(m.backend.forward(&b).is_err());
    // Two sequences on the same block: their tokens would write the same KV slots at once.
    let mut b = ForwardBatch::default();
    b.push_seq(&[1, 2], 0, &table, 16, Logits::Last);
    b.push_seq(&[3, 4], 0, &table, 16, Logits::Last);
    assert!(
        matches!(m.backend.forward(&b), Err(BackendError::InvalidBatch(e)) if e.contains("written by two tokens"))
    );
}

#[test]
fn bad_safetensors_are_reported() {
    let dir = tmp("st-model");
    std::fs::create_dir_all(&dir).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-llama");
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    // Header length pointing past the end.
    std::fs::write(dir.join("model.safetensors"), [255u8, 255, 0, 0, 0, 0, 0, 0, b'{']).unwrap();
    let e = err(&dir);
    assert!(e.contains("safetensors") && e.contains("model.safetensors"), "{e}");
    // A tensor of an unsupported dtype.
    let header =
        br#"{"model.embed_tokens.weight":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend_from_slice(&[0; 4]);
    std::fs::write(dir.join("model.safetensors"), b).unwrap();
    let e = err(&dir);
    assert!(e.contains("model.embed_tokens.weight") && e.contains("I32"), "{e}");
    // Broken config.json.
    std::fs::write(dir.join("config.json"), "{\"hidden_size\": ").unwrap();
    assert!(err(&dir).contains("config.json"));
}

#[test]
fn byte_flips_in_a_real_header_never_panic() {
    // The first 64 KiB of the default model hold its whole metadata and tensor directory.
    let path = tandem_engine::model_files::model_fetch::default_model_path().unwrap();
    let mut head = vec![0u8; 1 << 16];
    use std::io::Read;
    std::fs::File::open(&path).unwrap().read_exact(&mut head).unwrap();
    let mut state = 0x2545F4914F6CDD1Du64;
    for round in 0..300 {
        let mut b = head.clone();
        for _ in 0..1 + round % 6 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Bias towards the header's first 8 KiB where counts and lengths live.
            let i = (state % if round % 2 == 0 { 8192 } else { b.len() as u64 }) as usize;
            b[i] = (state >> 40) as u8;
        }
        // Truncated at 64 KiB, so every variant must fail cleanly.
        assert!(tandem_engine::model_files::gguf::GgufFile::from_bytes(b).is_err());
    }
}
