//! Replays the fuzz seeds and corpora (`fuzz/seeds/<target>/`, `fuzz/corpus/<target>/`) and the inputs of past crashes
//! (`fuzz/regressions/<target>/`) through the fuzz harness, so a fixed crash stays fixed in the
//! ordinary test run. The fuzzers themselves run under `scripts/fuzz/run.sh`.

#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

use std::path::Path;

fn inputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<_> = rd
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn corpora_and_regressions_replay_without_panics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    type Target = (&'static str, fn(&[u8]));
    let targets: [Target; 4] = [
        ("gguf", harness::gguf),
        ("openai_request", harness::openai_request),
        ("kv_page", harness::kv_page),
        ("chat_template", harness::chat_template),
    ];
    for (name, f) in targets {
        let mut seeds = inputs(&root.join("seeds").join(name));
        assert!(seeds.len() >= 2, "{name}: {} seeds", seeds.len());
        seeds.extend(inputs(&root.join("corpus").join(name)));
        let regressions = inputs(&root.join("regressions").join(name));
        for (file, data) in seeds.iter().chain(&regressions) {
            let r = std::panic::catch_unwind(|| f(data));
            assert!(r.is_ok(), "fuzz/{name}/{file} panics");
        }
        eprintln!("{name}: {} corpus inputs, {} regressions", seeds.len(), regressions.len());
    }
    // The seeds are valid inputs of their formats (the fuzzer starts from real structure).
    let tiny = std::fs::read(root.join("seeds/gguf/tiny-llama.gguf")).unwrap();
    let f =
        tandem_engine::model_files::gguf::GgufFile::from_bytes(tiny).expect("the GGUF seed parses");
    assert_eq!(f.get("general.architecture").and_then(|v| v.as_str()), Some("llama"));
    let page = std::fs::read(root.join("seeds/kv_page/page.bin")).unwrap();
    assert!(
        tandem_kv_transfer::page::KvPage::decode(&page, 1 << 20).is_ok(),
        "the page seed has a valid checksum"
    );
    let layout = std::fs::read(root.join("seeds/kv_page/layout.bin")).unwrap();
    assert!(tandem_kv_transfer::layout::KvLayout::decode(&layout).is_ok());
}
