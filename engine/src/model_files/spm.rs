//! SentencePiece vocabularies from GGUF (`tokenizer.ggml.model = "llama"`: Llama 1/2, Gemma,
//! Mistral), as a BPE whose merges are ranked by the score of the piece they make — the
//! construction Hugging Face uses for these tokenizers. Spaces become `▁` before the merges,
//! bytes without a piece become `<0xNN>` tokens (byte fallback), and decoding undoes both.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence};

use crate::LoadError;

/// The word-boundary mark SentencePiece writes for a space.
const SPACE: char = '▁';

/// GGUF token type of a byte piece (`<0xNN>`).
const TOKEN_TYPE_BYTE: u64 = 6;

/// The vocabulary's pieces as the BPE model sees them: a piece made only of spaces is written
/// with `▁` (GGUF keeps some user-defined whitespace pieces with literal spaces).
pub fn piece(token: &str) -> String {
    if !token.is_empty() && token.chars().all(|c| c == ' ') {
        token.replace(' ', &SPACE.to_string())
    } else {
        token.to_string()
    }
}

/// The BPE merges implied by a scored vocabulary: every split of a piece into two pieces, ranked
/// by the piece's score (higher first), ties by the ids of the two halves.
fn merges(pieces: &[String], scores: &[f32], types: &[u64]) -> Vec<(String, String)> {
    let ids: HashMap<&str, usize> =
        pieces.iter().enumerate().map(|(i, p)| (p.as_str(), i)).collect();
    let mut ranked: Vec<(f32, usize, usize)> = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        if types.get(i) == Some(&TOKEN_TYPE_BYTE) {
            continue; // byte pieces come from byte fallback, never from merges
        }
        for (at, _) in p.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (ids.get(&p[..at]), ids.get(&p[at..])) {
                ranked.push((scores[i], l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked.into_iter().map(|(_, l, r)| (pieces[l].clone(), pieces[r].clone())).collect()
}

/// A `tokenizers` tokenizer for a SentencePiece vocabulary (special tokens are added by the
/// caller). `add_space_prefix`: a `▁` is put before the text, and taken off when decoding.
pub fn tokenizer(
    tokens: &[String],
    scores: &[f32],
    types: &[u64],
    unk: Option<&str>,
    add_space_prefix: bool,
) -> Result<tokenizers::Tokenizer, LoadError> {
    if scores.len() != tokens.len() {
        return Err(LoadError::Tokenizer(format!(
            "{} token scores for {} tokens",
            scores.len(),
            tokens.len()
        )));
    }
    let pieces: Vec<String> = tokens.iter().map(|t| piece(t)).collect();
    let merges = merges(&pieces, scores, types);
    let vocab: tokenizers::models::bpe::Vocab =
        pieces.iter().enumerate().map(|(i, p)| (p.clone(), i as u32)).collect();
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(u) = unk {
        bpe = bpe.unk_token(u.to_string());
    }
    let bpe = bpe.build().map_err(|e| LoadError::Tokenizer(format!("cannot build BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", SPACE.to_string())
        .map_err(|e| LoadError::Tokenizer(format!("normalizer: {e}")))?;
    let mut norm = vec![NormalizerWrapper::Replace(replace)];
    if add_space_prefix {
        norm.insert(0, NormalizerWrapper::Prepend(Prepend::new(SPACE.to_string())));
    }
    let _ = t.with_normalizer(Some(NormalizerWrapper::Sequence(Sequence::new(norm))));
    let unspace = DecoderWrapper::Replace(
        Replace::new(SPACE.to_string(), " ")
            .map_err(|e| LoadError::Tokenizer(format!("decoder: {e}")))?,
    );
    let mut dec = vec![
        unspace,
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        dec.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    t.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(dec))));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_the_score_of_the_piece_they_make() {
        let pieces: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"].map(String::from).to_vec();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let m = merges(&pieces, &scores, &[1; 6]);
        let m: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(m, [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }
}
