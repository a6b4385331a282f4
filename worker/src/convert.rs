//! Conversions between the gRPC messages and the engine's types.

use tandem_engine::sampling::beam::BeamSearch;
use tandem_engine::sampling::sampler::{SampledToken, TokenLogprob};
use tandem_engine::scheduling::request_output::{CompletionOutput, StopReason};
use tandem_engine::SamplingParams;
use tandem_proto::v1 as pb;

/// The engine's parameters from the wire (every field is sent explicitly); a constraint that is
/// not the engine's JSON form is `INVALID_ARGUMENT`.
pub fn params_from_proto(p: &pb::SamplingParams) -> Result<SamplingParams, tonic::Status> {
    let structured = p
        .structured_output
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| tonic::Status::invalid_argument(format!("structured_output: {e}")))?;
    Ok(SamplingParams {
        n: p.n as usize,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        min_p: p.min_p,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        repetition_penalty: p.repetition_penalty,
        max_tokens: p.max_tokens as usize,
        min_tokens: p.min_tokens as usize,
        stop: p.stop.clone(),
        stop_token_ids: p.stop_token_ids.clone(),
        include_stop_str_in_output: p.include_stop_str_in_output,
        ignore_eos: p.ignore_eos,
        logprobs: p.logprobs.map(|k| k as usize),
        seed: p.seed,
        skip_special_tokens: p.skip_special_tokens,
        // Requests through the gateway are always served as text.
        detokenize: true,
        logit_bias: p.logit_bias.iter().map(|b| (b.token_id, b.bias)).collect(),
        structured,
        prompt_logprobs: p.prompt_logprobs.map(|k| k as usize),
        beam_search: p
            .beam_search
            .as_ref()
            .map(|b| BeamSearch { length_penalty: b.length_penalty }),
    })
}

/// The wire form of the engine's parameters.
pub fn params_to_proto(p: &SamplingParams) -> pb::SamplingParams {
    pb::SamplingParams {
        n: p.n as u32,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        min_p: p.min_p,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        repetition_penalty: p.repetition_penalty,
        max_tokens: p.max_tokens as u32,
        min_tokens: p.min_tokens as u32,
        stop: p.stop.clone(),
        stop_token_ids: p.stop_token_ids.clone(),
        include_stop_str_in_output: p.include_stop_str_in_output,
        ignore_eos: p.ignore_eos,
        logprobs: p.logprobs.map(|k| k as u32),
        seed: p.seed,
        skip_special_tokens: p.skip_special_tokens,
        logit_bias: p
            .logit_bias
            .iter()
            .map(|&(token_id, bias)| pb::TokenBias { token_id, bias })
            .collect(),
        structured_output: p
            .structured
            .as_ref()
            .map(|s| serde_json::to_string(s).expect("a constraint serialises")),
        prompt_logprobs: p.prompt_logprobs.map(|k| k as u32),
        beam_search: p.beam_search.map(|b| pb::BeamSearch { length_penalty: b.length_penalty }),
    }
}

fn lp_to_proto(t: &TokenLogprob) -> pb::TokenLogprob {
    pb::TokenLogprob { token_id: t.token_id, logprob: t.logprob }
}

fn lp_from_proto(t: &pb::TokenLogprob) -> TokenLogprob {
    TokenLogprob { token_id: t.token_id, logprob: t.logprob }
}

/// Wire form of a sampled token.
pub fn sampled_to_proto(s: &SampledToken) -> pb::SampledToken {
    pb::SampledToken {
        chosen: Some(lp_to_proto(&s.chosen)),
        top: s.top.iter().map(lp_to_proto).collect(),
        rank: s.rank,
    }
}

/// A sampled token from the wire.
pub fn sampled_from_proto(s: &pb::SampledToken) -> Option<SampledToken> {
    Some(SampledToken {
        chosen: lp_from_proto(s.chosen.as_ref()?),
        top: s.top.iter().map(lp_from_proto).collect(),
        rank: s.rank,
    })
}

/// Wire form of one completion's delta.
pub fn delta_to_proto(c: &CompletionOutput) -> pb::CompletionDelta {
    pb::CompletionDelta {
        index: c.index as u32,
        text: c.text.clone(),
        token_ids: c.token_ids.clone(),
        logprobs: c.logprobs.iter().map(sampled_to_proto).collect(),
        cumulative_logprob: c.cumulative_logprob,
        finish_reason: c.finish_reason.map(|f| f.as_str().to_string()).unwrap_or_default(),
        stop_reason: match &c.stop_reason {
            Some(StopReason::Str(s)) => s.clone(),
            _ => String::new(),
        },
        stop_token_id: match &c.stop_reason {
            Some(StopReason::Token(t)) => Some(*t),
            _ => None,
        },
    }
}

/// The gRPC status of an engine error, the same in every service: the request's own fault
/// (invalid, or its text cannot be tokenized) is `INVALID_ARGUMENT`, a reused id
/// `ALREADY_EXISTS`, a backend failure `INTERNAL`.
pub fn engine_status(e: &tandem_engine::EngineError) -> tonic::Status {
    use tandem_engine::EngineError as E;
    match e {
        E::InvalidRequest(m) => tonic::Status::invalid_argument(m.clone()),
        E::InvalidParam(p) => tonic::Status::invalid_argument(p.to_string()),
        E::Structured(e) => tonic::Status::invalid_argument(e.to_string()),
        E::Tokenize(t) => tonic::Status::invalid_argument(t.to_string()),
        E::DuplicateRequestId(_) => tonic::Status::already_exists(e.to_string()),
        E::Backend(_) => tonic::Status::internal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_engine::sampling::structured::StructuredOutput;

    #[test]
    fn engine_errors_map_to_one_status_each() {
        use tandem_engine::backend::BackendError;
        use tandem_engine::model_files::tokenizer::TokenizeError;
        use tandem_engine::EngineError as E;
        use tonic::Code;
        let bad_temperature =
            SamplingParams { temperature: 9.0, ..Default::default() }.validate(10).unwrap_err();
        let cases = [
            (E::InvalidRequest("n is 5".into()), Code::InvalidArgument),
            (E::InvalidParam(bad_temperature), Code::InvalidArgument),
            (E::Tokenize(TokenizeError("bad text".into())), Code::InvalidArgument),
            (E::DuplicateRequestId("r1".into()), Code::AlreadyExists),
            (E::Backend(BackendError::Device("out of memory".into())), Code::Internal),
        ];
        for (e, code) in cases {
            let s = engine_status(&e);
            assert_eq!(s.code(), code, "{e}");
            assert!(
                s.message().contains(&e.to_string()) || e.to_string().contains(s.message()),
                "{e}: {}",
                s.message()
            );
        }
    }

    #[test]
    fn params_round_trip() {
        let p = SamplingParams {
            n: 3,
            temperature: 0.7,
            top_p: 0.9,
            top_k: 40,
            min_p: 0.05,
            presence_penalty: 0.5,
            frequency_penalty: -0.5,
            repetition_penalty: 1.1,
            max_tokens: 77,
            min_tokens: 3,
            stop: vec!["\n\n".into(), "END".into()],
            stop_token_ids: vec![2, 7],
            include_stop_str_in_output: true,
            ignore_eos: true,
            logprobs: Some(5),
            seed: Some(42),
            skip_special_tokens: false,
            detokenize: true,
            logit_bias: vec![(3, -100.0), (9, 2.5)],
            prompt_logprobs: Some(3),
            beam_search: Some(BeamSearch { length_penalty: 0.25 }),
            structured: Some(StructuredOutput::Json(
                serde_json::json!({"type": "object", "properties": {"a": {"enum": [1, "x"]}}}),
            )),
        };
        assert_eq!(params_from_proto(&params_to_proto(&p)).unwrap(), p);
        let d = SamplingParams::default();
        assert_eq!(params_from_proto(&params_to_proto(&d)).unwrap(), d);
        for s in [
            StructuredOutput::JsonObject,
            StructuredOutput::Choice(vec!["a\"b".into(), "c".into()]),
            StructuredOutput::Regex("[0-9]+".into()),
            StructuredOutput::Grammar("start: \"x\"".into()),
        ] {
            let p = SamplingParams { structured: Some(s), ..Default::default() };
            assert_eq!(params_from_proto(&params_to_proto(&p)).unwrap(), p);
        }
        let bad = pb::SamplingParams {
            structured_output: Some("{\"xml\": 1}".into()),
            ..params_to_proto(&d)
        };
        assert_eq!(params_from_proto(&bad).unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn sampled_round_trip() {
        let s = SampledToken {
            chosen: TokenLogprob { token_id: 5, logprob: -0.25 },
            top: vec![TokenLogprob { token_id: 9, logprob: -0.1 }],
            rank: Some(3),
        };
        assert_eq!(sampled_from_proto(&sampled_to_proto(&s)).unwrap(), s);
        assert!(sampled_from_proto(&pb::SampledToken::default()).is_none());
    }
}
