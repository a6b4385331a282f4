//! `PrefillClients`: the decode worker's gRPC channels to prefill workers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tandem_proto::v1::prefill_worker_client::PrefillWorkerClient;
use tandem_worker::auth::{authed, AuthChannel};
use tonic::transport::{Channel, Endpoint};

/// gRPC channels to prefill workers, one per address, reused across requests.
#[derive(Default)]
pub struct PrefillClients {
    channels: Mutex<HashMap<String, Channel>>,
}

impl PrefillClients {
    /// A client for the prefill worker at `addr` ("host:port"); the channel connects lazily
    /// and pings the peer so a stalled worker is noticed within `stall`.
    pub fn get(
        &self,
        addr: &str,
        stall: Duration,
    ) -> Result<PrefillWorkerClient<AuthChannel>, String> {
        Ok(PrefillWorkerClient::new(authed(self.channel(addr, stall)?)))
    }

    /// The channel to the prefill worker at `addr` (see [`PrefillClients::get`]).
    pub fn channel(&self, addr: &str, stall: Duration) -> Result<Channel, String> {
        let mut map = self.channels.lock().expect("clients lock");
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("bad prefill worker address '{addr}': {e}"))?
            .connect_timeout(stall)
            .http2_keep_alive_interval(stall / 2)
            .keep_alive_timeout(stall / 2)
            .keep_alive_while_idle(true)
            .connect_lazy();
        map.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }
}
