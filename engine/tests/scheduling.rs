//! Scheduling policies on the tiny test model (fast): priority order, priority victims, abort
//! of a swapped-out sequence, and block ownership after every step.

use std::path::PathBuf;

use tandem_engine::scheduling::scheduler::{PreemptionMode, SchedulerConfig, SchedulingPolicy};
use tandem_engine::scheduling::sequence::SequenceStatus;
use tandem_engine::{
    EngineConfig, KvCacheSize, LLMEngine, LoadOptions, Model, Prompt, RequestOptions,
    SamplingParams,
};

fn tiny(kv_tokens: usize, swap_blocks: u64, sched: SchedulerConfig) -> LLMEngine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-llama");
    // 2 layers x 2 KV heads x 16 dims, f32 K and V, 16-token blocks.
    let block_bytes = 2 * 2 * 2 * 16 * 4 * 16;
    let opts = LoadOptions {
        kv_cache: KvCacheSize::Tokens(kv_tokens),
        swap_space_bytes: swap_blocks * block_bytes,
        ..Default::default()
    };
    LLMEngine::new(
        Model::load(&dir, opts).unwrap(),
        EngineConfig {
            scheduler: sched,
            enable_prefix_caching: false,
            speculative: None,
            zero_freed_blocks: false,
            overlap_steps: true,
            async_scheduling: true,
        },
    )
}

fn prompt(i: u32) -> Prompt {
    Prompt::TokenIds((0..20).map(|j| 3 + (i * 31 + j * 7) % 300).collect())
}

#[test]
fn priority_policy_serves_lower_values_first() {
    let sched = SchedulerConfig {
        max_num_seqs: 1,
        policy: SchedulingPolicy::Priority,
        ..Default::default()
    };
    let mut e = tiny(512, 0, sched);
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(4) };
    for (id, prio) in [("low", 5), ("high", -1), ("mid", 2)] {
        e.add_request_with(
            id,
            prompt((prio + 10) as u32),
            p.clone(),
            RequestOptions { priority: prio, ..Default::default() },
        )
        .unwrap();
    }
    let mut order = Vec::new();
    while e.has_unfinished_requests() {
        for o in e.step().unwrap() {
            if o.finished {
                order.push(o.request_id);
            }
        }
    }
    assert_eq!(order, ["high", "mid", "low"]);

    // FCFS ignores priorities.
    let sched = SchedulerConfig { max_num_seqs: 1, ..Default::default() };
    let mut e = tiny(512, 0, sched);
    for (id, prio) in [("first", 5), ("second", -1)] {
        e.add_request_with(
            id,
            prompt(1),
            p.clone(),
            RequestOptions { priority: prio, ..Default::default() },
        )
        .unwrap();
    }
    let mut order = Vec::new();
    while e.has_unfinished_requests() {
        order.extend(e.step().unwrap().into_iter().filter(|o| o.finished).map(|o| o.request_id));
    }
    assert_eq!(order, ["first", "second"]);
}

#[test]
fn priority_victims_are_the_lowest_priority() {
    // Room for about three sequences; four grow until one must be preempted.
    let sched = SchedulerConfig { policy: SchedulingPolicy::Priority, ..Default::default() };
    let mut e = tiny(8 * 16, 0, sched);
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(40) };
    for (id, prio) in [("a", 0), ("b", 9), ("c", 1), ("d", 2)] {
        e.add_request_with(
            id,
            prompt(prio as u32),
            p.clone(),
            RequestOptions { priority: prio, ..Default::default() },
        )
        .unwrap();
    }
    let mut first_preempted = None;
    while e.has_unfinished_requests() {
        e.step().unwrap();
        e.check_invariants().unwrap();
        if first_preempted.is_none() && !e.last_schedule().preempted.is_empty() {
            first_preempted = Some(e.last_schedule().preempted[0]);
        }
    }
    // Sequence ids follow arrival: "b" (priority 9) is id 1.
    assert_eq!(first_preempted, Some(1));
}

#[test]
fn aborting_a_swapped_sequence_frees_host_blocks() {
    let sched = SchedulerConfig { preemption_mode: PreemptionMode::Swap, ..Default::default() };
    let mut e = tiny(6 * 16, 32, sched);
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(50) };
    for i in 0..4 {
        e.add_request(&format!("r{i}"), prompt(i), p.clone(), None).unwrap();
    }
    let mut aborted = false;
    while e.has_unfinished_requests() {
        e.step().unwrap();
        e.check_invariants().unwrap();
        if !aborted && e.queue_lengths().2 > 0 {
            assert!(e.block_manager().num_free_host_blocks() < e.block_manager().num_host_blocks());
            let swapped = (0..4)
                .map(|i| format!("r{i}"))
                .find(|id| {
                    e.request_status(id).is_some_and(|s| s.contains(&SequenceStatus::Swapped))
                })
                .expect("a swapped request");
            assert!(e.abort_request(&swapped));
            aborted = true;
        }
    }
    assert!(aborted, "nothing was swapped out");
    let bm = e.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks());
    assert_eq!(bm.num_free_host_blocks(), bm.num_host_blocks());
}

/// Steps `e` to the end, asserting after every step that the running set stays within
/// `max_num_seqs`; returns the order in which requests finished.
fn run_within(e: &mut LLMEngine, max_num_seqs: usize) -> Vec<String> {
    let mut order = Vec::new();
    for _ in 0..100_000 {
        if !e.has_unfinished_requests() {
            return order;
        }
        order.extend(e.step().unwrap().into_iter().filter(|o| o.finished).map(|o| o.request_id));
        let (_, running, _) = e.queue_lengths();
        assert!(running <= max_num_seqs, "{running} sequences running, limit {max_num_seqs}");
        e.check_invariants().unwrap();
    }
    panic!("the requests did not finish");
}

#[test]
fn forked_completions_count_against_max_num_seqs() {
    let sched = SchedulerConfig { max_num_seqs: 4, ..Default::default() };
    let mut e = tiny(4096, 0, sched);
    let p = SamplingParams { ignore_eos: true, n: 3, ..SamplingParams::greedy(6) };
    for i in 0..5 {
        e.add_request(&format!("r{i}"), prompt(i), p.clone(), None).unwrap();
    }
    let order = run_within(&mut e, 4);
    assert_eq!(order.len(), 5);

    // A request that could never fit is refused up front, with the reason.
    let err = e.add_request("too-wide", prompt(9), SamplingParams { n: 5, ..p }, None).unwrap_err();
    assert!(err.to_string().contains("at most 4 sequences"), "{err}");
}

#[test]
fn one_groups_many_sequences_do_not_starve_a_newcomer() {
    // 16 prompts x n=4 arrive before a single small request, with room for 8 sequences; returns
    // how many requests finished before the small one.
    let small_finishes_after = |grouped: bool| {
        let sched = SchedulerConfig { max_num_seqs: 8, ..Default::default() };
        let mut e = tiny(8192, 0, sched);
        let wide = SamplingParams { ignore_eos: true, n: 4, ..SamplingParams::greedy(8) };
        for i in 0..16 {
            let group = grouped.then(|| "batch".to_string());
            let opts = RequestOptions { group, ..Default::default() };
            e.add_request_with(&format!("batch-{i}"), prompt(i), wide.clone(), opts).unwrap();
        }
        let small = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(4) };
        e.add_request("small", prompt(99), small, None).unwrap();
        let order = run_within(&mut e, 8);
        order.iter().position(|r| r == "small").unwrap()
    };
    // One client request (one group): the newcomer is admitted as soon as a slot frees.
    let pos = small_finishes_after(true);
    assert!(pos <= 2, "the small request finished after {pos} of the group's prompts");
    // Every prompt its own request: first come, first served, so the small request finishes
    // (nearly) last; the grouping is what makes the difference.
    let pos = small_finishes_after(false);
    assert!(pos >= 12, "the small request finished after only {pos} prompts");
}
