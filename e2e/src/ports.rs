//! Free loopback ports for the processes under test, shared out across every test process so that two tests
//! never bind the same one.

/// The first port handed out, and how many there are: below Linux's ephemeral range (32768-60999), so the kernel
/// never gives one of them to some other test's outgoing connection or `bind(0)` between the moment a test picks
/// it and the moment the process under test binds it (seen: a worker failing with "address already in use").
const PORT_BASE: u16 = 20_000;

const PORT_SPAN: u32 = 12_000;

/// A port no other test process of this machine has been handed recently (a counter shared through a locked file
/// in the temporary directory, wrapping after [`PORT_SPAN`]) that `bind` can bind now.
fn fresh_port(bind: impl Fn(u16) -> std::io::Result<std::net::SocketAddr>) -> std::net::SocketAddr {
    use std::io::{Read, Seek, Write};
    let path = std::env::temp_dir().join("zl-e2e-ports");
    for _ in 0..1000 {
        let n = {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .expect("the port counter file");
            file.lock().expect("lock the port counter");
            let mut text = String::new();
            file.read_to_string(&mut text).expect("read the port counter");
            let n: u32 = text.trim().parse().unwrap_or(0);
            file.set_len(0).expect("truncate the port counter");
            file.rewind().expect("rewind the port counter");
            write!(file, "{}", (n + 1) % PORT_SPAN).expect("write the port counter");
            n
        };
        if let Ok(addr) = bind(PORT_BASE + n as u16) {
            return addr;
        }
    }
    panic!("no free port after 1000 tries");
}

/// A free UDP port on 127.0.0.1 (for QUIC listeners), handed out to no other test.
pub fn free_udp() -> std::net::SocketAddr {
    fresh_port(|port| std::net::UdpSocket::bind(("127.0.0.1", port))?.local_addr())
}

/// A free TCP port on 127.0.0.1 (for HTTP listeners), handed out to no other test.
pub fn free_tcp() -> std::net::SocketAddr {
    fresh_port(|port| std::net::TcpListener::bind(("127.0.0.1", port))?.local_addr())
}

/// A port on 127.0.0.1 free for both TCP and UDP (Consul's gossip listens on both), handed out to no other test.
pub fn free_tcp_udp() -> std::net::SocketAddr {
    fresh_port(|port| {
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port))?;
        std::net::UdpSocket::bind(tcp.local_addr()?)?;
        tcp.local_addr()
    })
}
