//! The fuzz harness: one function per target, each feeding arbitrary bytes to a parser that
//! faces untrusted input and requiring it to return (an error is fine; a panic, hang or abort
//! is a bug). Shared by the libFuzzer targets and by the corpus replay test.

use tandem_engine::model_files::chat_template::{ChatMessage, ChatTemplate};
use tandem_engine::model_files::gguf::GgufFile;
use tandem_engine::ModelConfig;
use tandem_kv_transfer::layout::KvLayout;
use tandem_kv_transfer::page::{KvPage, HEADER_BYTES};
use tandem_router::openai::{self, ChatRequest, CompletionRequest};

/// Chat templates the gateway renders: a ChatML one and a Llama-style one with a system slot.
const TEMPLATES: [&str; 2] = [
    include_str!("../../tests/data/tiny-qwen3/chat_template.jinja"),
    include_str!("../../tests/data/tiny-llama/chat_template.jinja"),
];

/// GGUF files: header, metadata, tensor table; then what the loader derives from them.
pub fn gguf(data: &[u8]) {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    let _ = ModelConfig::from_gguf(&f);
    for key in ["general.architecture", "tokenizer.ggml.tokens", "tokenizer.chat_template"] {
        if let Some(v) = f.get(key) {
            let _ = (v.as_str(), v.as_u64(), v.as_array().map(<[_]>::len));
        }
    }
    if let Some(t) = f.tensor("token_embd.weight") {
        let _ = t.num_elements();
    }
}

/// OpenAI request bodies through the gateway's validation, as both endpoints parse them.
pub fn openai_request(data: &[u8]) {
    if let Ok((c, common)) = openai::parse_body::<CompletionRequest>(data) {
        let logprobs = c.logprobs.and_then(|n| openai::logprob_count("logprobs", n).ok());
        if let Ok(mut p) = openai::sampling_params(&common, logprobs) {
            if let Ok(m) = openai::max_tokens("max_tokens", common.max_tokens, Some(16), 8, 2048) {
                p.max_tokens = m;
                let _ = openai::check_params(&p, 49152);
            }
        }
    }
    if let Ok((c, common)) = openai::parse_body::<ChatRequest>(data) {
        if let Ok(p) = openai::sampling_params(&common, None) {
            let _ = openai::check_params(&p, 49152);
        }
        if let Some(messages) = &c.messages {
            if let Ok(msgs) = openai::chat_messages(messages) {
                render_all(&msgs);
            }
        }
    }
}

/// KV transfer frames from the network: page headers, whole pages, layout handshakes.
pub fn kv_page(data: &[u8]) {
    let _ = KvLayout::decode(data);
    let _ = KvPage::decode(data, 1 << 20);
    if data.len() >= HEADER_BYTES {
        let mut h = [0u8; HEADER_BYTES];
        h.copy_from_slice(&data[..HEADER_BYTES]);
        let _ = KvPage::parse_header(&h, 1 << 20);
    }
}

/// Chat messages (roles and contents from the bytes) through the chat templates.
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // Messages separated by 0x1e, role and content by 0x1f.
    let msgs: Vec<ChatMessage> = text
        .split('\u{1e}')
        .map(|m| match m.split_once('\u{1f}') {
            Some((role, content)) => ChatMessage::new(role, content),
            None => ChatMessage::new("user", m),
        })
        .collect();
    render_all(&msgs);
}

fn render_all(msgs: &[ChatMessage]) {
    // Compiled once: the inputs under test are the messages, not the templates.
    static COMPILED: std::sync::OnceLock<Vec<ChatTemplate>> = std::sync::OnceLock::new();
    let templates = COMPILED.get_or_init(|| {
        TEMPLATES
            .iter()
            .map(|src| ChatTemplate::new(src, "<s>", "</s>").expect("the templates compile"))
            .collect()
    });
    for t in templates {
        let _ = t.render(msgs, true);
        let _ = t.render(msgs, false);
    }
}
