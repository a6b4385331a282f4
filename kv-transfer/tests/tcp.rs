//! KV pages over loopback TCP between two real backends of the default model, and the failure
//! cases: refused handshake, corrupt page, stalled sender, vanished sender.

use std::time::Duration;

use tandem_engine::backend::{ForwardBatch, KernelPath, Logits, ModelBackend};
use tandem_engine::sampling::sampler::argmax;
use tandem_engine::scheduling::block_hash::DEFAULT_HASH_SEED;
use tandem_engine::{model_files::model_fetch, LoadOptions, Model};
use tandem_kv_transfer::tcp::{PageSink, TcpReceiver, TcpSender};
use tandem_kv_transfer::{KvDtype, KvLayout, KvPage, TransferError};

const TIMEOUT: Duration = Duration::from_millis(500);

fn model() -> Model {
    let opts = LoadOptions { kernel: KernelPath::Fast, ..LoadOptions::with_kv_tokens(256) };
    Model::load(&model_fetch::default_model_path().unwrap(), opts).unwrap()
}

fn layout(m: &Model) -> KvLayout {
    let c = &m.config;
    let spec = m.backend.kv_cache_spec();
    KvLayout {
        model_id: c.name.clone(),
        dtype: KvDtype::F32,
        block_size: spec.block_size as u32,
        num_layers: c.num_layers as u32,
        num_kv_heads: c.num_kv_heads as u32,
        head_dim: c.head_dim as u32,
        hash_seed: DEFAULT_HASH_SEED,
    }
}

fn decode(b: &mut dyn ModelBackend, first: u32, start: usize, table: &[u32], n: usize) -> Vec<u32> {
    let bs = b.kv_cache_spec().block_size;
    let mut out = vec![first];
    for i in 0..n {
        let mut batch = ForwardBatch::default();
        batch.push_seq(&[*out.last().unwrap()], start + i, table, bs, Logits::Last);
        out.push(argmax(&b.forward(&batch).unwrap()));
    }
    out
}

/// Writes page `i` into `table[i]` of a backend.
struct BackendSink<'a> {
    backend: &'a mut dyn ModelBackend,
    table: Vec<u32>,
}

impl PageSink for BackendSink<'_> {
    fn target(&mut self, _id: u64, index: u32, _hash: u64) -> Option<u32> {
        self.table.get(index as usize).copied()
    }
    fn write(&mut self, block: u32, payload: Vec<u8>) -> Result<(), String> {
        self.backend.write_block(block, &payload).map_err(|e| e.to_string())
    }
}

#[test]
fn decode_after_transfer_equals_local_decode() {
    let mut prefill = model();
    let mut decoder = model();
    let prompt = prefill.tokenizer.encode("The history of the Roman Empire spans many centuries, from the founding of the city of Rome to the fall of Constantinople", false).unwrap();
    assert!(
        prompt.len() > 16 && !prompt.len().is_multiple_of(16),
        "prompt of {} tokens: want full and partial blocks",
        prompt.len()
    );
    let bs = 16;
    let n_blocks = (prompt.len() + 24).div_ceil(bs);
    let src_table: Vec<u32> = (0..n_blocks as u32).collect();
    // The decoder's blocks are elsewhere in its pool.
    let dst_table: Vec<u32> = (0..n_blocks as u32).map(|i| 15 - 2 * i).collect();
    let mut batch = ForwardBatch::default();
    batch.push_seq(&prompt, 0, &src_table, bs, Logits::Last);
    let first = argmax(&prefill.backend.forward(&batch).unwrap());

    let receiver = TcpReceiver::bind("127.0.0.1:0", layout(&decoder), TIMEOUT).unwrap();
    let addr = receiver.local_addr().unwrap();
    let pages = prompt.len().div_ceil(bs);
    std::thread::scope(|scope| {
        let backend = &mut *decoder.backend;
        let table = dst_table.clone();
        let rx = scope.spawn(move || receiver.serve_one(&mut BackendSink { backend, table }));
        let mut tx = TcpSender::connect(addr, &layout(&prefill), TIMEOUT).unwrap();
        for (i, &block) in src_table.iter().enumerate().take(pages) {
            let payload = prefill.backend.read_block(block).unwrap();
            tx.send(&KvPage { transfer_id: 42, index: i as u32, block_hash: i as u64, payload })
                .unwrap();
        }
        assert_eq!(tx.finish(42, pages as u32).unwrap(), pages as u32);
        let summary = rx.join().unwrap().unwrap();
        assert_eq!(summary.pages, pages as u32);
        assert_eq!(summary.bytes, (pages * layout(&prefill).page_bytes()) as u64);
    });
    let local = decode(&mut *prefill.backend, first, prompt.len(), &src_table, 24);
    let remote = decode(&mut *decoder.backend, first, prompt.len(), &dst_table, 24);
    assert_eq!(remote, local);
}

struct NullSink(u32);
impl PageSink for NullSink {
    fn target(&mut self, _: u64, index: u32, _: u64) -> Option<u32> {
        Some(index)
    }
    fn write(&mut self, _: u32, _: Vec<u8>) -> Result<(), String> {
        self.0 += 1;
        Ok(())
    }
}

fn small_layout() -> KvLayout {
    KvLayout {
        model_id: "m".into(),
        dtype: KvDtype::F32,
        block_size: 16,
        num_layers: 2,
        num_kv_heads: 1,
        head_dim: 8,
        hash_seed: 1,
    }
}

#[test]
fn layout_mismatch_is_refused_with_the_field() {
    let receiver = TcpReceiver::bind("127.0.0.1:0", small_layout(), TIMEOUT).unwrap();
    let addr = receiver.local_addr().unwrap();
    let rx = std::thread::spawn(move || receiver.serve_one(&mut NullSink(0)));
    let theirs = KvLayout { block_size: 32, ..small_layout() };
    let err = TcpSender::connect(addr, &theirs, TIMEOUT).err().expect("refused");
    assert!(matches!(&err, TransferError::Refused(m) if m.contains("block_size")), "{err}");
    assert!(matches!(
        rx.join().unwrap(),
        Err(TransferError::LayoutMismatch { field: "block_size", .. })
    ));
}

#[test]
fn corrupt_page_is_rejected_and_reported_to_the_sender() {
    let receiver = TcpReceiver::bind("127.0.0.1:0", small_layout(), TIMEOUT).unwrap();
    let addr = receiver.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let mut sink = NullSink(0);
        (receiver.serve_one(&mut sink), sink.0)
    });
    let mut tx = TcpSender::connect(addr, &small_layout(), TIMEOUT).unwrap();
    let page = KvPage {
        transfer_id: 1,
        index: 0,
        block_hash: 5,
        payload: vec![7; small_layout().page_bytes()],
    };
    let mut frame = page.encode();
    let last = frame.len() - 1;
    frame[last] ^= 0x40;
    tx.send_raw(&frame).unwrap();
    let err = tx.finish(1, 1).unwrap_err();
    assert!(err.to_string().contains("corrupt"), "{err}");
    let (res, written) = rx.join().unwrap();
    assert!(matches!(res, Err(TransferError::Checksum { index: 0, .. })));
    assert_eq!(written, 0, "a corrupt page must never reach the blocks");
}

#[test]
fn stalled_and_vanished_senders_are_detected() {
    for vanish in [false, true] {
        let receiver = TcpReceiver::bind("127.0.0.1:0", small_layout(), TIMEOUT).unwrap();
        let addr = receiver.local_addr().unwrap();
        let rx = std::thread::spawn(move || receiver.serve_one(&mut NullSink(0)));
        let mut tx = TcpSender::connect(addr, &small_layout(), TIMEOUT).unwrap();
        let page = KvPage {
            transfer_id: 1,
            index: 0,
            block_hash: 5,
            payload: vec![7; small_layout().page_bytes()],
        };
        let frame = page.encode();
        tx.send_raw(&frame[..frame.len() / 2]).unwrap();
        if vanish {
            drop(tx);
        } else {
            std::thread::sleep(TIMEOUT * 3);
        }
        // A stall ends in the socket timeout (the bound), a vanished peer in end-of-stream.
        let err = rx.join().unwrap().unwrap_err();
        if vanish {
            assert!(err.to_string().contains("closed"), "{err}");
        } else {
            assert!(matches!(err, TransferError::Timeout(t) if t == TIMEOUT), "{err}");
        }
    }
}

#[test]
fn receivers_with_a_secret_refuse_senders_without_it() {
    use tandem_kv_transfer::tcp::auth_digest;
    for (presented, accepted) in
        [(None, false), (Some(auth_digest("other")), false), (Some(auth_digest("s3cret")), true)]
    {
        let receiver = TcpReceiver::bind("127.0.0.1:0", small_layout(), TIMEOUT)
            .unwrap()
            .require_auth(Some(auth_digest("s3cret")));
        let addr = receiver.local_addr().unwrap();
        let rx = std::thread::spawn(move || receiver.serve_one(&mut NullSink(0)));
        match TcpSender::connect_with_auth(addr, &small_layout(), TIMEOUT, presented) {
            Ok(tx) => {
                assert!(accepted, "a sender without the secret got in");
                assert_eq!(tx.finish(1, 0).unwrap(), 0);
                assert!(rx.join().unwrap().is_ok());
            }
            Err(e) => {
                assert!(!accepted, "the right secret was refused: {e}");
                assert!(
                    matches!(&e, TransferError::Refused(m) if m.contains("unauthenticated")),
                    "{e}"
                );
                assert!(rx.join().unwrap().is_err());
            }
        }
    }
}

/// A sink whose writes take `delay` to complete (an engine busy with a long step).
struct SlowSink {
    written: u32,
    delay: Duration,
    since: Option<std::time::Instant>,
}
impl PageSink for SlowSink {
    fn target(&mut self, _: u64, index: u32, _: u64) -> Option<u32> {
        Some(index)
    }
    fn write(&mut self, _: u32, _: Vec<u8>) -> Result<(), String> {
        self.written += 1;
        Ok(())
    }
    fn flush_wait(&mut self, wait: Duration) -> Result<bool, String> {
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        std::thread::sleep(wait);
        Ok(since.elapsed() >= self.delay)
    }
}

#[test]
fn busy_is_not_stalled_on_either_side() {
    // The sender waits three timeouts for its next pages, then the receiver's writes take three
    // more: with keep-alives in between, the transfer completes.
    let receiver = TcpReceiver::bind("127.0.0.1:0", small_layout(), TIMEOUT).unwrap();
    let addr = receiver.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let mut sink = SlowSink { written: 0, delay: TIMEOUT * 3, since: None };
        (receiver.serve_one(&mut sink), sink.written)
    });
    let mut tx = TcpSender::connect(addr, &small_layout(), TIMEOUT).unwrap();
    let page = |i: u32| KvPage {
        transfer_id: 9,
        index: i,
        block_hash: 0,
        payload: vec![i as u8; small_layout().page_bytes()],
    };
    tx.send(&page(0)).unwrap();
    for _ in 0..12 {
        std::thread::sleep(TIMEOUT / 4);
        tx.keepalive().unwrap();
    }
    tx.send(&page(1)).unwrap();
    assert_eq!(tx.finish(9, 2).unwrap(), 2);
    let (res, written) = rx.join().unwrap();
    assert_eq!(res.unwrap().pages, 2);
    assert_eq!(written, 2);
}
