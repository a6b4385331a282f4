//! `host_steps` with mimalloc as the global allocator (the `tandem` binary's): the two compare
//! the allocators on the engine's host work per step.

#[path = "instant_device/mod.rs"]
mod instant_device;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    instant_device::run()
}
