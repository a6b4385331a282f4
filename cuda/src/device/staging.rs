//! Host-to-device copies through page-locked memory.
//!
//! A copy from pageable memory may make the driver wait for the stream before it stages the
//! bytes ("If pageable memory must first be staged to pinned memory, the driver may
//! synchronize with the stream"): with a pass still running, a step's plan upload then waits
//! for that pass, and the device idles while the host finishes queueing the next one. Small
//! copies go instead through a ring of page-locked slots: the bytes are written there and the
//! copy is queued from there, so queueing never waits for the device. A slot is filled front to
//! back and reused only once the copies queued from it have run (its event, recorded when the
//! ring moved past it).

use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream, PinnedHostSlice};

use crate::CudaError;

/// Bytes of one slot; a copy larger than this goes from pageable memory as before.
pub(super) const SLOT_BYTES: usize = 1 << 20;
/// Slots in the ring (a slot holds tens of steps' uploads).
const SLOTS: usize = 4;
/// Where each copy starts in a slot.
const ALIGN: usize = 64;

struct Slot {
    buf: PinnedHostSlice<u8>,
    /// The slot's first byte (page-locked, written only here, read by the copies).
    base: usize,
    /// Recorded on the stream when the ring moved past the slot: every copy from it is done
    /// once this is.
    done: CudaEvent,
    /// Whether `done` was recorded since the slot was last filled.
    pending: bool,
}

/// The ring of page-locked slots small uploads go through.
pub(super) struct Staging {
    slots: Vec<Slot>,
    cur: usize,
    used: usize,
}

impl Staging {
    /// Allocates the ring.
    pub(super) fn new(ctx: &std::sync::Arc<CudaContext>) -> Result<Staging, CudaError> {
        let mut slots = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            // SAFETY: page-locked bytes only this ring writes, before the copies it queues.
            let mut buf = unsafe { ctx.alloc_pinned::<u8>(SLOT_BYTES) }.map_err(CudaError::from)?;
            let base = buf.as_mut_slice().map_err(CudaError::from)?.as_mut_ptr() as usize;
            let done = ctx.new_event(None).map_err(CudaError::from)?;
            slots.push(Slot { buf, base, done, pending: false });
        }
        Ok(Staging { slots, cur: 0, used: 0 })
    }

    /// Queues the copy of `bytes` to device address `dst` on `stream` through the ring;
    /// false (nothing queued) when they do not fit a slot.
    pub(super) fn copy(
        &mut self,
        stream: &CudaStream,
        dst: u64,
        bytes: &[u8],
    ) -> Result<bool, CudaError> {
        let n = bytes.len();
        if n > SLOT_BYTES {
            return Ok(false);
        }
        if self.used + n > SLOT_BYTES {
            // Past this slot: its copies are done once this event is; the next slot's were
            // queued a ring ago and have run, unless the device is that far behind.
            let s = &mut self.slots[self.cur];
            s.done.record(stream).map_err(CudaError::from)?;
            s.pending = true;
            self.cur = (self.cur + 1) % self.slots.len();
            self.used = 0;
            let next = &mut self.slots[self.cur];
            if next.pending {
                next.done.synchronize().map_err(CudaError::from)?;
                next.pending = false;
            }
        }
        let s = &self.slots[self.cur];
        debug_assert_eq!(s.buf.len(), SLOT_BYTES);
        let at = s.base + self.used;
        // SAFETY: `at..at + n` lies in the slot (checked above), which no queued copy still
        // reads: bytes before `used` are never rewritten until the slot's event has passed.
        let staged = unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, n);
            std::slice::from_raw_parts(at as *const u8, n)
        };
        // SAFETY: `dst` holds `n` bytes (the caller's slice); the source stays as written
        // until the copy has run (above).
        unsafe { result::memcpy_htod_async(dst, staged, stream.cu_stream()) }
            .map_err(CudaError::from)?;
        self.used += n.div_ceil(ALIGN) * ALIGN;
        Ok(true)
    }
}
