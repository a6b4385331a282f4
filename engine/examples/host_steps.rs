//! The engine's host work per step with an instant device (see `instant_device/mod.rs`), on the
//! system allocator: `cargo run --release -p tandem-engine --example host_steps`.

#[path = "instant_device/mod.rs"]
mod instant_device;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    instant_device::run()
}
