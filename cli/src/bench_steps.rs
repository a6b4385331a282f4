//! `tandem bench engine`'s steps by kind: where a run's time goes. Every step the engine ran is
//! put in one class — steps that compute prompt tokens, and decode-only steps by how many
//! sequences they decode — and each class gets its steps' wall time (the time between one
//! step's tokens and the next's: what the step added to the run), the device's own time on
//! them, and, on one GPU, their share of the run's HBM bound (the weights once a step and the
//! decode rows' KV, at the device's copy bandwidth).

use tandem_engine::llm_engine::step_trace::StepRecord;

/// What the bound charges a step: the weights once, and the KV of each position a decode row
/// attends, at the copy bandwidth.
#[derive(Debug, Clone, Copy)]
pub struct BoundRate {
    /// Device copy bandwidth, bytes read plus written per second.
    pub bytes_per_s: f64,
    /// Bytes of the linear layers' weights (read once a step).
    pub weight_bytes: f64,
    /// KV bytes of one position, all layers.
    pub kv_per_position: f64,
}

impl BoundRate {
    /// The seconds the bound allows `r`.
    fn seconds(&self, r: &StepRecord) -> f64 {
        (self.weight_bytes + r.decode_positions as f64 * self.kv_per_position) / self.bytes_per_s
    }
}

/// One class of steps and its totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepClass {
    /// The class: "with prompts", or "decode A-B" (decode rows per step).
    pub name: &'static str,
    /// Steps in it.
    pub steps: usize,
    /// Prompt tokens its steps computed.
    pub prompt_tokens: usize,
    /// Decode rows its steps computed.
    pub decode_rows: usize,
    /// Wall seconds its steps added to the run.
    pub wall: f64,
    /// The device's own seconds on them (steps the backend timed).
    pub device: f64,
    /// Steps the backend timed.
    pub timed: usize,
    /// Seconds the HBM bound allows them, where it is known.
    pub bound: Option<f64>,
}

/// Decode-only steps are classed by decode rows: at most the first bound, the second, ….
const DECODE_CLASSES: [(usize, &str); 5] = [
    (16, "decode 1-16"),
    (64, "decode 17-64"),
    (128, "decode 65-128"),
    (256, "decode 129-256"),
    (usize::MAX, "decode 257+"),
];

/// `records` (in the order their tokens came back) by class, the classes with steps only.
pub fn classes(records: &[StepRecord], rate: Option<BoundRate>) -> Vec<StepClass> {
    let mut out: Vec<StepClass> = std::iter::once("with prompts")
        .chain(DECODE_CLASSES.iter().map(|c| c.1))
        .map(|name| StepClass { name, bound: rate.map(|_| 0.0), ..StepClass::default() })
        .collect();
    let mut last = records.first().map_or(0.0, |r| r.launched);
    for r in records {
        let i = match r.prompt_tokens {
            0 => 1 + DECODE_CLASSES.iter().position(|c| r.decode_rows <= c.0).unwrap_or(4),
            _ => 0,
        };
        let c = &mut out[i];
        c.steps += 1;
        c.prompt_tokens += r.prompt_tokens;
        c.decode_rows += r.decode_rows;
        c.wall += (r.collected - last).max(0.0);
        last = last.max(r.collected);
        if let Some(d) = r.device {
            c.device += d;
            c.timed += 1;
        }
        if let (Some(b), Some(rate)) = (&mut c.bound, rate) {
            *b += rate.seconds(r);
        }
    }
    out.retain(|c| c.steps > 0);
    out
}

/// One line per class, for the text report.
pub fn lines(classes: &[StepClass]) -> Vec<String> {
    classes
        .iter()
        .map(|c| {
            let ms = |s: f64| 1e3 * s / c.steps as f64;
            let mut l = format!(
                "  {:<15} {:>5} steps ({} prompt tokens, {} decode rows): wall {:.3} s ({:.2} ms a step)",
                c.name,
                c.steps,
                c.prompt_tokens,
                c.decode_rows,
                c.wall,
                ms(c.wall)
            );
            if c.timed > 0 {
                l += &format!(", device {:.3} s ({} timed)", c.device, c.timed);
            }
            if let Some(b) = c.bound {
                l += &format!(", bound {:.3} s = {:.1} % of wall", b, 100.0 * b / c.wall.max(1e-12));
                if c.timed == c.steps && c.device > 0.0 {
                    l += &format!(", {:.1} % of device", 100.0 * b / c.device);
                }
            }
            l
        })
        .collect()
}

/// The classes as JSON.
pub fn json(classes: &[StepClass]) -> serde_json::Value {
    classes
        .iter()
        .map(|c| {
            serde_json::json!({"class": c.name, "steps": c.steps, "prompt_tokens": c.prompt_tokens,
                "decode_rows": c.decode_rows, "wall_seconds": c.wall, "device_seconds": c.device,
                "timed_steps": c.timed, "bound_seconds": c.bound})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(launched: f64, collected: f64, prompt: usize, rows: usize, pos: usize) -> StepRecord {
        StepRecord {
            launched,
            collected,
            prompt_tokens: prompt,
            decode_rows: rows,
            decode_positions: pos,
            device: Some(0.5 * (collected - launched)),
        }
    }

    #[test]
    fn steps_are_classed_by_prompt_tokens_then_decode_rows() {
        // A prefill step, two overlapping decode steps of 100 rows, one of 3 rows.
        let r = [
            rec(0.0, 1.0, 500, 0, 0),
            rec(0.8, 1.5, 0, 100, 10_000),
            rec(1.2, 2.5, 0, 100, 10_100),
            rec(2.4, 2.6, 0, 3, 30),
        ];
        let rate = BoundRate { bytes_per_s: 100.0, weight_bytes: 10.0, kv_per_position: 0.01 };
        let c = classes(&r, Some(rate));
        let names: Vec<_> = c.iter().map(|c| c.name).collect();
        assert_eq!(names, ["with prompts", "decode 1-16", "decode 65-128"]);
        assert_eq!((c[0].steps, c[0].prompt_tokens, c[0].wall), (1, 500, 1.0));
        // Wall: from one step's tokens to the next's (0.5 + 1.0), not launch to collection.
        let d = &c[2];
        assert_eq!((d.steps, d.decode_rows), (2, 200));
        assert!((d.wall - 1.5).abs() < 1e-12, "{}", d.wall);
        assert!((d.device - 1.0).abs() < 1e-12);
        // Bound: weights twice (0.2 s) + 20,100 positions × 0.01 B at 100 B/s (2.01 s).
        assert!((d.bound.unwrap() - 2.21).abs() < 1e-9, "{:?}", d.bound);
        assert!((c[1].wall - 0.1).abs() < 1e-12);
        let l = lines(&c);
        assert!(l[2].contains("decode 65-128") && l[2].contains("2 steps"), "{}", l[2]);
        // Without a bound (the CPU), none is reported.
        assert!(classes(&r, None).iter().all(|c| c.bound.is_none()));
        assert_eq!(json(&c)[2]["decode_rows"], 200);
    }
}
