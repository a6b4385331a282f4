//! Tiny model files shared by the integration tests.

#![allow(dead_code)] // each test file uses its own part

use tandem_engine::model_files::gguf::GgufWriter;

/// Vocabulary size of [`tiny_llama`]: two chat tokens and runs of letters.
pub const VOCAB: u64 = 40;

/// Small deterministic f32 weights (multiples of 0.01 in −0.08..0.08).
pub fn small_f32(n: u64) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.01).collect()
}

/// A complete one-layer Llama GGUF (hidden `h`, feed-forward `ff`, four query heads and two KV
/// heads, a byte-pair vocabulary of [`VOCAB`], a chat template). Norms are f32 ones; each weight
/// matrix comes from `matrix(name, rows, cols)` as its GGML type id and data.
pub fn tiny_llama(
    h: u64,
    ff: u64,
    mut matrix: impl FnMut(&str, u64, u64) -> (u32, Vec<u8>),
) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.str("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .u32("llama.embedding_length", h as u32)
        .u32("llama.feed_forward_length", ff as u32)
        .u32("llama.attention.head_count", 4)
        .u32("llama.attention.head_count_kv", 2)
        .u32("llama.context_length", 128)
        .f32("llama.rope.freq_base", 10000.0)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "smollm")
        .u32("tokenizer.ggml.bos_token_id", 0)
        .u32("tokenizer.ggml.eos_token_id", 1)
        .str("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}");
    let mut tokens: Vec<String> = vec!["<|im_start|>".into(), "<|im_end|>".into()];
    tokens.extend(
        (0..VOCAB - 2)
            .map(|i| ((b'a' + (i % 26) as u8) as char).to_string().repeat(1 + i as usize / 26)),
    );
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    w.str_array("tokenizer.ggml.tokens", &refs);
    w.i32_array(
        "tokenizer.ggml.token_type",
        &[3, 3]
            .iter()
            .copied()
            .chain(std::iter::repeat_n(1, VOCAB as usize - 2))
            .collect::<Vec<_>>(),
    );
    w.str_array("tokenizer.ggml.merges", &["a a"]);
    for norm in ["output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"] {
        w.tensor_f32(&format!("{norm}.weight"), &[h], &vec![1.0; h as usize]);
    }
    let kv = h / 2;
    let mats = [
        ("token_embd", VOCAB, h),
        ("blk.0.attn_q", h, h),
        ("blk.0.attn_k", kv, h),
        ("blk.0.attn_v", kv, h),
        ("blk.0.attn_output", h, h),
        ("blk.0.ffn_gate", ff, h),
        ("blk.0.ffn_up", ff, h),
        ("blk.0.ffn_down", h, ff),
    ];
    for (name, n, k) in mats {
        let name = format!("{name}.weight");
        let (ty, data) = matrix(&name, n, k);
        w.tensor(&name, &[k, n], ty, data);
    }
    w
}
