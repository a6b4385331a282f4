//! A pass's host-to-device inputs (its plan, sampling arguments and deferred-token pairs)
//! gathered in page-locked memory, sent up as one copy and put in their buffers by one
//! `scatter_words` kernel: one copy and one launch a step in place of eight copies from pageable
//! memory, each of which the driver stages through its own buffer and the stream runs as a
//! copy-engine operation of its own. `TANDEM_PACKED_UPLOADS=0` copies each input on its own,
//! as before (for comparison).

use cudarc::driver::{CudaEvent, CudaSlice, LaunchConfig, PinnedHostSlice};

use crate::device::{ptr, Gpu};
use crate::CudaError;

/// Inputs one copy carries at most (a pass has nine).
const MAX_FIELDS: usize = 16;
/// Words of the descriptor table at the start of a copy: per input its destination (low and
/// high words), its first word in the copy and its length.
const HEADER: usize = 4 * MAX_FIELDS;
/// Copies in flight at once: a slot is written again only when the copy three flushes back has
/// been scattered (a pass in flight and one planned ahead use two).
const SLOTS: usize = 3;
/// Largest copy, words (24 MiB of slots in all, host and device); inputs beyond it go up on
/// their own.
const MAX_WORDS: usize = 1 << 20;

/// One copy's page-locked source, its device landing place, and the event reached once the
/// scatter has read it.
struct Slot {
    host: PinnedHostSlice<u32>,
    dev: CudaSlice<u32>,
    done: CudaEvent,
}

/// Four-byte values an input is made of.
pub(super) trait Word: Copy {
    /// The value's bits.
    fn bits(self) -> u32;
}
impl Word for u32 {
    fn bits(self) -> u32 {
        self
    }
}
impl Word for i32 {
    fn bits(self) -> u32 {
        self as u32
    }
}

/// The inputs pushed since the last flush, and the slots they go up through.
pub(super) struct Uploads {
    packed: bool,
    /// Words one slot holds (header included), fixed at first use.
    cap: usize,
    slots: Vec<Slot>,
    next: usize,
    /// The slot being filled (taken from the ring at the first push after a flush).
    cur: Option<usize>,
    fields: usize,
    used: usize,
}

impl Uploads {
    /// Uploads through slots of up to `words` words of inputs (allocated now, so that the KV
    /// cache sized after them leaves them room), or each on its own when
    /// `TANDEM_PACKED_UPLOADS=0`.
    pub(super) fn new(g: &Gpu, words: usize) -> Result<Self, CudaError> {
        let packed = std::env::var("TANDEM_PACKED_UPLOADS").as_deref() != Ok("0");
        let cap = HEADER + words.min(MAX_WORDS);
        let mut slots = Vec::new();
        while packed && slots.len() < SLOTS {
            // SAFETY: page-locked memory written only by `push` and read by the copies of
            // `flush`.
            let host = unsafe { g.ctx.alloc_pinned::<u32>(cap) }?;
            slots.push(Slot { host, dev: g.zeros::<u32>(cap)?, done: g.ctx.new_event(None)? });
        }
        Ok(Uploads { packed, cap, slots, next: 0, cur: None, fields: 0, used: HEADER })
    }

    /// Forgets inputs pushed and not flushed (a pass that failed half-way).
    pub(super) fn clear(&mut self) {
        self.cur = None;
        self.fields = 0;
        self.used = HEADER;
    }

    /// Queues `data` for `dst` from element `at` on: into the current copy, or straight up when
    /// packing is off or the copy has no room left.
    pub(super) fn push<T: Word + cudarc::driver::DeviceRepr>(
        &mut self,
        g: &Gpu,
        dst: &mut CudaSlice<T>,
        at: usize,
        data: &[T],
    ) -> Result<(), CudaError> {
        if data.is_empty() {
            return Ok(());
        }
        if at + data.len() > dst.len() {
            return Err(CudaError::Unsupported(format!(
                "{} words at {at} into a buffer of {}",
                data.len(),
                dst.len()
            )));
        }
        let start = self.used.next_multiple_of(4);
        if !self.packed || self.fields == MAX_FIELDS || start + data.len() > self.cap {
            return g.write_at(dst, at, data);
        }
        let slot = self.slot()?;
        let to = ptr(dst) + (4 * at) as u64;
        let host = self.slots[slot].host.as_mut_slice()?;
        put(host, self.fields, start, to, data.iter().map(|v| v.bits()));
        self.fields += 1;
        self.used = start + data.len();
        Ok(())
    }

    /// Sends the inputs pushed since the last flush up and scatters them (nothing if none).
    pub(super) fn flush(&mut self, g: &Gpu) -> Result<(), CudaError> {
        let Some(slot) = self.cur else { return Ok(()) };
        let (fields, used) = (self.fields, self.used);
        self.clear();
        let s = &mut self.slots[slot];
        let host = s.host.as_mut_slice()?;
        let longest = (0..fields).map(|f| host[4 * f + 3]).max().unwrap_or(0);
        // SAFETY: `dev` holds `cap` ≥ `used` words; the host words stay untouched until `done`
        // (waited for in `slot` before this slot is written again).
        unsafe {
            let stream = g.stream.cu_stream();
            cudarc::driver::result::memcpy_htod_async(ptr(&s.dev), &host[..used], stream)
        }?;
        let n = fields as i32;
        let cfg = LaunchConfig {
            grid_dim: (longest.div_ceil(256).clamp(1, 64), fields as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: scatter_words(src, n): `src` holds n descriptors (destination, first word,
        // length) then the words they name; each destination was checked to hold its words.
        unsafe { g.launch(&g.k.scatter_words, cfg, &[&ptr(&s.dev), &n]) }?;
        s.done.record(&g.stream)?;
        Ok(())
    }

    /// The slot being filled, taken from the ring (and waited for) at a copy's first push.
    fn slot(&mut self) -> Result<usize, CudaError> {
        if let Some(s) = self.cur {
            return Ok(s);
        }
        let s = self.next;
        self.next = (s + 1) % SLOTS;
        // The copy last made from this slot has been scattered before its words are replaced.
        self.slots[s].done.synchronize()?;
        self.cur = Some(s);
        Ok(s)
    }
}

/// Writes input number `field` into a copy's words: its descriptor (destination `to`, first
/// word `start`, length) in the table, its words from `start` on.
fn put(
    host: &mut [u32],
    field: usize,
    start: usize,
    to: u64,
    words: impl ExactSizeIterator<Item = u32>,
) {
    let len = words.len();
    for (h, v) in host[start..start + len].iter_mut().zip(words) {
        *h = v;
    }
    host[4 * field..4 * field + 4].copy_from_slice(&[
        to as u32,
        (to >> 32) as u32,
        start as u32,
        len as u32,
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `scatter_words` does, over a host "device" of 64-bit addresses.
    fn scatter(words: &[u32], fields: usize, mem: &mut std::collections::BTreeMap<u64, u32>) {
        for f in 0..fields {
            let d = &words[4 * f..4 * f + 4];
            let to = u64::from(d[0]) | (u64::from(d[1]) << 32);
            for i in 0..d[3] as usize {
                mem.insert(to + 4 * i as u64, words[d[2] as usize + i]);
            }
        }
    }

    #[test]
    fn packed_inputs_land_where_they_were_pushed() {
        let mut host = vec![0u32; HEADER + 64];
        let inputs: [(u64, Vec<u32>); 3] = [
            (0x7_0000_1000, vec![1, 2, 3]),
            (0x7_0000_2004, vec![u32::MAX, 0x8000_0000]),
            (0x9_8000_0000, (10..27).collect()),
        ];
        let mut used = HEADER;
        for (f, (to, data)) in inputs.iter().enumerate() {
            let start = used.next_multiple_of(4);
            put(&mut host, f, start, *to, data.iter().copied());
            used = start + data.len();
        }
        assert_eq!(used, HEADER + 4 + 4 + 17, "each input starts on a 16-byte boundary");
        let mut mem = std::collections::BTreeMap::new();
        scatter(&host[..used], inputs.len(), &mut mem);
        for (to, data) in &inputs {
            for (i, v) in data.iter().enumerate() {
                assert_eq!(mem.get(&(to + 4 * i as u64)), Some(v));
            }
        }
        assert_eq!(mem.len(), 3 + 2 + 17);
    }
}
