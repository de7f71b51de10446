//! The edge's per-client connection cap: one address (an IPv6 client by its /64, which one host usually holds
//! whole) may hold at most so many connections at once, so one client opening sockets by the thousand cannot take
//! the slots of everyone else (health probes included). Sans-IO: the server loop asks for a slot per accepted
//! connection and the slot frees itself when dropped.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use zl_common::sync::lock;

/// Connections held per client.
#[derive(Debug)]
pub(crate) struct ClientSlots {
    /// The most one client may hold (0: no cap).
    cap: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's hold on its client's count.
#[derive(Debug)]
pub(crate) struct ClientSlot {
    slots: Arc<ClientSlots>,
    client: IpAddr,
}

/// The address a client is counted by: an IPv4 address (also when mapped into IPv6), or an IPv6 address's /64.
fn client_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !((1u128 << 64) - 1))),
        },
    }
}

impl ClientSlots {
    /// At most `cap` connections per client (0: no cap).
    pub(crate) fn new(cap: usize) -> Arc<ClientSlots> {
        Arc::new(ClientSlots { cap, held: Mutex::default() })
    }

    /// A slot for a connection from `ip`, or `None` when its client holds its cap already.
    pub(crate) fn take(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let client = client_of(ip);
        let mut held = lock(&self.held);
        let n = held.entry(client).or_default();
        if self.cap > 0 && *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(ClientSlot { slots: self.clone(), client })
    }

    /// Clients holding a connection now.
    #[cfg(test)]
    fn clients(&self) -> usize {
        lock(&self.held).len()
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = lock(&self.slots.held);
        if let Some(n) = held.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_holds_at_most_its_cap_and_gets_slots_back() {
        let slots = ClientSlots::new(2);
        let a = [slots.take(ip("10.0.0.1")).unwrap(), slots.take(ip("10.0.0.1")).unwrap()];
        assert!(slots.take(ip("10.0.0.1")).is_none());
        assert!(slots.take(ip("::ffff:10.0.0.1")).is_none(), "an IPv4-mapped address is the same client");
        let other = slots.take(ip("10.0.0.2")).expect("another client is not affected");
        drop(a);
        assert!(slots.take(ip("10.0.0.1")).is_some());
        drop(other);
        assert_eq!(slots.clients(), 0, "nothing is kept for clients that left");
    }

    #[test]
    fn an_ipv6_client_is_its_64() {
        let slots = ClientSlots::new(1);
        let _held = slots.take(ip("2001:db8:1:2::1")).unwrap();
        assert!(slots.take(ip("2001:db8:1:2:ffff::9")).is_none(), "the same /64");
        assert!(slots.take(ip("2001:db8:1:3::1")).is_some(), "another /64");
        let unlimited = ClientSlots::new(0);
        let many: Vec<_> = (0..1000).map(|_| unlimited.take(ip("10.0.0.1")).unwrap()).collect();
        assert_eq!(many.len(), 1000);
    }
}
