//! Beam search (`use_beam_search`, vLLM's fields): the request goes to one decode worker,
//! whose engine runs the search over copy-on-write forks of its beams
//! (`tandem_engine::sampling::beam`) and answers with the `n` best, ranked; the router checks
//! the fields first, so a conflicting one is a 400 before anything is queued.

use tandem_engine::sampling::beam::BeamSearch;

use crate::error::ApiError;
use crate::openai::CommonParams;
use crate::relay::Prepared;

/// The length penalty when the request asks for beam search (`use_beam_search`; default 1),
/// after checking what only the gateway knows: streaming, tools, `best_of`, `echo` with
/// logprobs and prompt log-probabilities (`other`) are a 400 naming the field. The sampling
/// fields are checked by [`apply`], under the engine's rules.
pub(crate) fn requested(c: &CommonParams, other: bool) -> Result<Option<f64>, ApiError> {
    if c.use_beam_search != Some(true) {
        if c.length_penalty.is_some() {
            return Err(ApiError::invalid(
                Some("length_penalty"),
                "length_penalty applies to beam search only (use_beam_search: true)",
            ));
        }
        return Ok(None);
    }
    let refuse = |param: &str, why: &str| {
        Err(ApiError::invalid(
            Some(param),
            format!("{param} cannot be combined with use_beam_search: {why}"),
        ))
    };
    if c.stream == Some(true) {
        return refuse("stream", "the beams are ranked at the end");
    }
    if other {
        return refuse(
            "use_beam_search",
            "prompt log-probabilities, tools, best_of and echo with logprobs are answered by sampling only",
        );
    }
    Ok(Some(c.length_penalty.unwrap_or(1.0)))
}

/// Turns `p` into a beam search with `length_penalty`: every prompt's parameters carry it, and
/// are checked again under beam search's rules.
pub(crate) fn apply(
    p: &mut Prepared,
    length_penalty: f64,
    vocab_size: usize,
) -> Result<(), ApiError> {
    for params in &mut p.params {
        params.beam_search = Some(BeamSearch { length_penalty });
        crate::openai::check_params(params, vocab_size)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beam_fields_are_checked_before_anything_is_queued() {
        let c = |v: serde_json::Value| serde_json::from_value::<CommonParams>(v).unwrap();
        let beam = c(serde_json::json!({ "use_beam_search": true, "length_penalty": 0.5 }));
        assert_eq!(requested(&beam, false).unwrap(), Some(0.5));
        assert_eq!(requested(&c(serde_json::json!({})), false).unwrap(), None);
        let refused =
            |v: serde_json::Value, other: bool| requested(&c(v), other).unwrap_err().param;
        assert_eq!(
            refused(serde_json::json!({ "length_penalty": 2.0 }), false).as_deref(),
            Some("length_penalty")
        );
        assert_eq!(
            refused(serde_json::json!({ "use_beam_search": true, "stream": true }), false)
                .as_deref(),
            Some("stream")
        );
        assert_eq!(
            refused(serde_json::json!({ "use_beam_search": true }), true).as_deref(),
            Some("use_beam_search")
        );
    }
}
