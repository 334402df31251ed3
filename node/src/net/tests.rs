//! The mesh's tests: real swarms on loopback.
use super::*;
use metatopia_sim::Tick;

fn key(i: u8) -> SigningKey {
    SigningKey::from_bytes(&[i; 32])
}

fn loopback(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

fn addrs(n: usize) -> Vec<(SocketAddr, SocketAddr)> {
    let tcp = free_ports(n).unwrap();
    let udp = free_udp_ports(n).unwrap();
    tcp.into_iter().zip(udp).map(|(t, u)| (loopback(t), loopback(u))).collect()
}

/// The next message from `rx` within 10 s (skipping announcements).
async fn next(rx: &mut mpsc::UnboundedReceiver<MeshEvent>) -> (ValidatorIndex, NodeMsg) {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("a message within 10 s") {
            Some(MeshEvent::Message(i, m)) => return (i, m),
            Some(MeshEvent::Joined { .. }) => {}
            None => panic!("the mesh stopped"),
        }
    }
}

async fn until_connected(m: &Mesh, n: usize) {
    let t0 = std::time::Instant::now();
    while m.connected() < n {
        assert!(t0.elapsed() < Duration::from_secs(15), "{} of {n} peers connected", m.connected());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn peer_ids_are_the_node_keys() {
    let k = key(7).verifying_key();
    let id = peer_id(&k);
    assert_eq!(peer_key(&id), Some(k));
    assert_eq!(peer_key(&PeerId::random()), None, "not an ed25519 identity");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_nodes_connect_over_quic_and_are_numbered_by_their_keys() {
    let a = addrs(3);
    let peers: Vec<PeerAddr> =
        (0..3).map(|i| PeerAddr::direct(key(i as u8 + 1).verifying_key(), Some(a[i].0), Some(a[i].1))).collect();
    let mut meshes = Vec::new();
    for (i, (tcp, quic)) in a.iter().enumerate() {
        meshes.push(Mesh::start(&key(i as u8 + 1), *tcp, Some(*quic), peers.clone()).await.unwrap());
    }
    for (m, _) in &meshes {
        until_connected(m, 2).await;
    }
    assert!(meshes[0].0.transports().values().all(|v| *v == "quic"), "{:?}", meshes[0].0.transports());
    meshes[0].0.broadcast(&NodeMsg::SnapshotRequest);
    for (_, rx) in &mut meshes[1..] {
        assert_eq!(next(rx).await, (ValidatorIndex(0), NodeMsg::SnapshotRequest));
    }
    let m = NodeMsg::Snapshot { tick: Tick(9), bytes: vec![7; 300_000] };
    meshes[2].0.send(1, &m);
    assert_eq!(next(&mut meshes[1].1).await, (ValidatorIndex(2), m));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delay_stage_holds_each_frame_and_keeps_their_order() {
    let a = addrs(2);
    let peers: Vec<PeerAddr> =
        (0..2).map(|i| PeerAddr::direct(key(i as u8 + 1).verifying_key(), Some(a[i].0), Some(a[i].1))).collect();
    let delay = LinkDelay { one_way: Duration::from_millis(40), jitter_percent: 50 };
    let (m0, _rx0) = Mesh::start_delayed(&key(1), a[0].0, Some(a[0].1), peers.clone(), delay).await.unwrap();
    let (m1, mut rx1) = Mesh::start(&key(2), a[1].0, Some(a[1].1), peers).await.unwrap();
    until_connected(&m0, 1).await;
    until_connected(&m1, 1).await;
    let frame = |tick: u64| NodeMsg::Snapshot { tick: Tick(tick), bytes: vec![tick as u8; 100] };
    m0.send(1, &frame(0u64));
    assert_eq!(next(&mut rx1).await.1, frame(0u64), "the stream is open");
    let t0 = std::time::Instant::now();
    for t in 1..=40 {
        m0.send(1, &frame(t));
    }
    assert_eq!(next(&mut rx1).await.1, frame(1u64));
    // At least the delay less its jitter (a loaded machine can only add to it).
    assert!(t0.elapsed() >= Duration::from_millis(20), "{:?}", t0.elapsed());
    // In order, whatever each frame's jitter.
    for t in 2..=40 {
        assert_eq!(next(&mut rx1).await.1, frame(t));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quic_the_nodes_fall_back_to_tcp() {
    let a = addrs(2);
    // Node 1 listens on TCP only; node 0 is told of a QUIC address where nothing answers.
    let peers = vec![
        PeerAddr::direct(key(1).verifying_key(), Some(a[0].0), Some(a[0].1)),
        PeerAddr::direct(key(2).verifying_key(), Some(a[1].0), Some(a[1].1)),
    ];
    let (m0, _rx0) = Mesh::start(&key(1), a[0].0, Some(a[0].1), peers.clone()).await.unwrap();
    // (Node 1 does not dial: only node 0's dial, QUIC first, makes the connection.)
    let unknown = vec![PeerAddr { tcp: None, quic: None, ..peers[0].clone() }, peers[1].clone()];
    let (m1, mut rx1) = Mesh::start(&key(2), a[1].0, None, unknown).await.unwrap();
    until_connected(&m0, 1).await;
    until_connected(&m1, 1).await;
    m0.send(1, &NodeMsg::SnapshotRequest);
    assert_eq!(next(&mut rx1).await, (ValidatorIndex(0), NodeMsg::SnapshotRequest));
    assert_eq!(m0.transports().get(&1), Some(&"tcp"), "{:?}", m0.transports());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_known_by_its_key_not_its_address() {
    let a = addrs(2);
    let (k1, k2, impostor) = (key(1), key(2), key(3));
    // Node 0 expects key 2 at node 1's address, but the impostor listens there.
    let expected = vec![
        PeerAddr::direct(k1.verifying_key(), Some(a[0].0), Some(a[0].1)),
        PeerAddr::direct(k2.verifying_key(), Some(a[1].0), Some(a[1].1)),
    ];
    let (m0, mut rx0) = Mesh::start(&k1, a[0].0, Some(a[0].1), expected.clone()).await.unwrap();
    // The impostor dials node 0 itself, and says it is validator 1 by sending as it would.
    let theirs = vec![expected[0].clone(), PeerAddr::direct(impostor.verifying_key(), None, None)];
    let (m1, _rx1) = Mesh::start(&impostor, a[1].0, Some(a[1].1), theirs).await.unwrap();
    until_connected(&m1, 1).await;
    m1.send(0, &NodeMsg::SnapshotRequest);
    // Node 0 numbers it as a node outside its list, under its real key.
    let t0 = std::time::Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx0.recv()).await.unwrap().unwrap() {
            MeshEvent::Joined { index, key } => {
                assert_eq!((index, key), (2, impostor.verifying_key()));
            }
            MeshEvent::Message(from, m) => {
                assert_eq!((from, m), (ValidatorIndex(2), NodeMsg::SnapshotRequest));
                break;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert_eq!(m0.key_of(2), Some(impostor.verifying_key()));
    // And its dials to "validator 1" at that address never connect as validator 1.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(m0.transports().keys().copied().collect::<Vec<_>>(), vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_port_harms_nothing() {
    use tokio::io::AsyncWriteExt as _;
    let a = addrs(2);
    let peers: Vec<PeerAddr> =
        (0..2).map(|i| PeerAddr::direct(key(i as u8 + 1).verifying_key(), Some(a[i].0), Some(a[i].1))).collect();
    let (m0, _rx0) = Mesh::start(&key(1), a[0].0, Some(a[0].1), peers.clone()).await.unwrap();
    for len in [0usize, 1, 40, 5_000] {
        let mut s = tokio::net::TcpStream::connect(a[0].0).await.unwrap();
        let _ = s.write_all(&vec![0xa5; len]).await;
    }
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    u.send_to(&[0xff; 1200], a[0].1).unwrap();
    let (m1, mut rx1) = Mesh::start(&key(2), a[1].0, Some(a[1].1), peers).await.unwrap();
    until_connected(&m0, 1).await;
    until_connected(&m1, 1).await;
    m0.send(1, &NodeMsg::SnapshotRequest);
    assert_eq!(next(&mut rx1).await, (ValidatorIndex(0), NodeMsg::SnapshotRequest));
}

/// A node outside the list gets the sim's broadcasts only once it asks (a join, a snapshot, a
/// consensus message), and gives its index back when it leaves: strangers coming and going one
/// after another all take the same index, and none can use the index space up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_broadcasts_only_after_asking_and_its_index_is_taken_again() {
    let a = addrs(6);
    let listed = vec![PeerAddr::direct(key(1).verifying_key(), Some(a[0].0), Some(a[0].1))];
    let (m0, mut rx0) = Mesh::start(&key(1), a[0].0, Some(a[0].1), listed.clone()).await.unwrap();
    let frame = |tick: u64| NodeMsg::Snapshot { tick: Tick(tick), bytes: vec![1; 10] };
    for s in 1..6u8 {
        let stranger = key(40 + s);
        let mut theirs = listed.clone();
        theirs.push(PeerAddr::direct(stranger.verifying_key(), None, None));
        let i = usize::from(s);
        let (m, mut rx) = Mesh::start(&stranger, a[i].0, Some(a[i].1), theirs).await.unwrap();
        // Node 0 numbers it: the index the stranger before it left.
        let index = match tokio::time::timeout(Duration::from_secs(10), rx0.recv()).await.unwrap().unwrap() {
            MeshEvent::Joined { index, key } => {
                assert_eq!(key, stranger.verifying_key());
                index
            }
            MeshEvent::Message(from, msg) => panic!("from {from:?} before it joined: {msg:?}"),
        };
        assert_eq!(index, 1, "stranger {s}");
        assert_eq!(m0.key_of(1), Some(stranger.verifying_key()));
        // A message to it arrives once its stream is open (sent again until then), a broadcast
        // does not...
        let t0 = std::time::Instant::now();
        loop {
            m0.send(index, &frame(0u64));
            if let Ok(Some(MeshEvent::Message(_, f))) =
                tokio::time::timeout(Duration::from_millis(200), rx.recv()).await
            {
                assert_eq!(f, frame(0u64));
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "stranger {s}: no stream");
        }
        m0.broadcast(&frame(1u64));
        // ...until it asks: then the next broadcast is the next thing it gets (after any of the
        // messages sent while its stream opened).
        m.send(0, &NodeMsg::JoinRequest);
        assert_eq!(next(&mut rx0).await, (ValidatorIndex(1), NodeMsg::JoinRequest));
        m0.broadcast(&frame(2u64));
        let got = loop {
            let (_, f) = next(&mut rx).await;
            if f != frame(0u64) {
                break f;
            }
        };
        assert_eq!(got, frame(2u64), "stranger {s}");
        m.stop();
        drop((m, rx));
        let t0 = std::time::Instant::now();
        while m0.connected() > 0 {
            assert!(t0.elapsed() < Duration::from_secs(20), "stranger {s} still connected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The relay's bounds, measured: a node of the world holds a reservation and is reached
/// through the relay; a stranger is refused a reservation, and what it pushes through
/// circuits to a node of the world is cut at each circuit's byte limit, with no more than
/// its circuits a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_use_a_relay_beyond_its_limits() {
    use crate::net::reach::Reachability;
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let a = addrs(3);
    let (kr, ka, ks) = (key(1), key(2), key(3));
    let at = |k: &SigningKey, i: usize| PeerAddr::direct(k.verifying_key(), Some(a[i].0), Some(a[i].1));
    let hex = |k: &SigningKey| metatopia_sim::ids::hex(k.verifying_key().as_bytes());
    const CIRCUIT: u64 = 64 * 1024;
    let limits = RelayLimits { circuit_bytes: CIRCUIT, circuits_per_minute: 2, ..RelayLimits::default() };
    let options = |r: Reachability| MeshOptions {
        relay: limits,
        reachability: Some(r),
        // On loopback a hole punch always succeeds; the relay's bounds are what is measured.
        no_hole_punching: true,
        ..MeshOptions::default()
    };
    // The relay knows the member; nobody lists the stranger.
    let world = vec![at(&kr, 0), at(&ka, 1)];
    let (relay, _rr) =
        Mesh::start_with(&kr, a[0].0, Some(a[0].1), world.clone(), options(Reachability::Public)).await.unwrap();
    let (member, mut from_stranger) =
        Mesh::start_with(&ka, a[1].0, Some(a[1].1), world, options(Reachability::Private)).await.unwrap();
    let t0 = std::time::Instant::now();
    while member.net_info().relays != vec![hex(&kr)] {
        assert!(t0.elapsed() < Duration::from_secs(15), "the member holds a reservation: {:?}", member.net_info());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (stranger, _rs) =
        Mesh::start_with(&ks, a[2].0, Some(a[2].1), vec![at(&kr, 0), at(&ks, 2)], options(Reachability::Private))
            .await
            .unwrap();
    let t0 = std::time::Instant::now();
    while relay.net_info().relay_refused == 0 {
        assert!(t0.elapsed() < Duration::from_secs(15), "the stranger's reservation is refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stranger.net_info().relays.is_empty());
    assert_eq!(relay.net_info().serving_reservations, 1, "the member's only");
    // The stranger reaches the member through the relay (it knows no address of it) and
    // pushes 8 KiB frames at it for 6 s.
    let to = stranger.add_contact(PeerAddr::direct(ka.verifying_key(), None, None)).unwrap();
    let frame = NodeMsg::Snapshot { tick: Tick(1), bytes: vec![7; 8 * 1024] };
    let size = frame.encode().len() as u64;
    // `wanted`: what it tried to send; `offered`: what it could hand to a connection.
    let (mut wanted, mut offered, mut received, mut relayed_seen) = (0u64, 0u64, 0u64, false);
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        wanted += size;
        if let Some(p) = stranger.net_info().paths.get(&hex(&ka)) {
            relayed_seen |= *p == "relayed";
            assert_eq!(*p, "relayed", "never direct: the stranger knows no address of the member");
            stranger.send(to, &frame);
            offered += size;
        }
        while let Ok(ev) = from_stranger.try_recv() {
            if let MeshEvent::Message(_, NodeMsg::Snapshot { bytes, .. }) = ev {
                received += bytes.len() as u64;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = relay.net_info().relay_refused;
    eprintln!(
        "stranger: wanted to send {wanted} bytes in 6 s, {offered} handed to a circuit, {received} delivered; \
         relay refused {refused} requests"
    );
    assert!(relayed_seen && received > 0, "a stranger may reach a node of the world, within bounds");
    assert!(wanted >= 8 * CIRCUIT, "the stranger wanted far more than its circuits carry: {wanted}");
    assert!(received <= 2 * CIRCUIT, "at most two circuits a minute of {CIRCUIT} bytes each: {received}");
    assert!(refused >= 2, "its third circuit in the minute is refused as well as its reservation: {refused}");
}

fn card_of(k: &SigningKey, addr: SocketAddr, relayed: Vec<String>) -> card::Card {
    let body = card::CardBody {
        key: k.verifying_key().to_bytes(),
        sim: 2,
        pos: [0, 0],
        addr,
        quic: None,
        since_ms: 1,
        http: None,
        relayed,
    };
    card::Card::sign(k, body)
}

/// A card names at most four relayed addresses, each a circuit to its own node.
#[test]
fn a_card_names_only_circuits_to_its_own_node() {
    let (k, other) = (key(21), key(22));
    let (me, them) = (peer_id(&k.verifying_key()), peer_id(&other.verifying_key()));
    let relay = peer_id(&key(23).verifying_key());
    let circuit = |to: PeerId| format!("/ip4/10.0.0.1/udp/7000/quic-v1/p2p/{relay}/p2p-circuit/p2p/{to}");
    let addr = loopback(7000);
    let good = card_of(&k, addr, vec![circuit(me)]);
    assert_eq!(good.check(), Ok(()));
    assert_eq!(PeerAddr::of_card(&good.body).unwrap().relayed, vec![circuit(me).parse::<Multiaddr>().unwrap()]);
    let bad = |relayed: Vec<String>| card_of(&k, addr, relayed).check().unwrap_err();
    assert!(bad(vec![circuit(me); 5]).contains("5 relayed addresses"), "{}", bad(vec![circuit(me); 5]));
    assert!(bad(vec![circuit(them)]).contains("not a circuit to the card's node"));
    assert!(bad(vec!["/ip4/10.0.0.1/udp/7000/quic-v1".into()]).contains("not a circuit"));
    assert!(bad(vec!["not an address".into()]).contains("card relayed address"));
    assert!(bad(vec![format!("/ip4/10.0.0.1/tcp/1{}", "0".repeat(300))]).contains("bytes"));
}

/// A node behind a NAT is dialed through the relays its signed card names by a node that
/// shares no relay with it and cannot reach it directly (a node of another sim, say).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_a_nat_is_dialed_through_the_relays_its_card_names() {
    use crate::net::reach::Reachability;
    let a = addrs(3);
    let (kr, kb, kc) = (key(11), key(12), key(13));
    let at = |k: &SigningKey, i: usize| PeerAddr::direct(k.verifying_key(), Some(a[i].0), Some(a[i].1));
    let hex = |k: &SigningKey| metatopia_sim::ids::hex(k.verifying_key().as_bytes());
    let options = |r: Reachability| MeshOptions {
        reachability: Some(r),
        // On loopback a hole punch always succeeds; the relayed path is what is tested.
        no_hole_punching: true,
        ..MeshOptions::default()
    };
    let world = vec![at(&kr, 0), at(&kb, 1)];
    let (_relay, _rr) =
        Mesh::start_with(&kr, a[0].0, Some(a[0].1), world.clone(), options(Reachability::Public)).await.unwrap();
    let (home, mut at_home) =
        Mesh::start_with(&kb, a[1].0, Some(a[1].1), world, options(Reachability::Private)).await.unwrap();
    let t0 = std::time::Instant::now();
    while home.relayed_addresses().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(15), "a reservation on the relay: {:?}", home.net_info());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let relayed: Vec<String> = home.relayed_addresses().iter().map(ToString::to_string).collect();
    assert!(relayed[0].ends_with(&format!("/p2p-circuit/p2p/{}", home.local_peer_id())), "{relayed:?}");
    // Its card as a node of another sim gets it: a direct address nobody listens on (a home
    // behind a NAT), and the relayed one.
    let closed = loopback(free_ports(1).unwrap()[0]);
    let card = card_of(&kb, closed, relayed);
    assert_eq!(card.check(), Ok(()));
    let (far, _rf) =
        Mesh::start_with(&kc, a[2].0, Some(a[2].1), vec![at(&kc, 2)], options(Reachability::Private)).await.unwrap();
    let to = far.add_outsiders(vec![PeerAddr::of_card(&card.body).unwrap()])[0];
    let t0 = std::time::Instant::now();
    while far.net_info().paths.get(&hex(&kb)) != Some(&"relayed") {
        assert!(t0.elapsed() < Duration::from_secs(20), "connected through the relay: {:?}", far.net_info());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    far.send(to, &NodeMsg::SnapshotRequest);
    let (_, m) = next(&mut at_home).await;
    assert_eq!(m, NodeMsg::SnapshotRequest);
}

/// A node whose mesh port is taken says so, with the cause (libp2p's error displayed as
/// nothing, and the operator read "listening: " and no more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_is_a_clear_error() {
    let a = addrs(1);
    let taken = std::net::TcpListener::bind(a[0].0).unwrap();
    let peers = vec![PeerAddr::direct(key(1).verifying_key(), Some(a[0].0), Some(a[0].1))];
    let e = Mesh::start(&key(1), a[0].0, Some(a[0].1), peers).await.map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("in use"), "{e}");
    drop(taken);
}
