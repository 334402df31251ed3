//! The fuzz targets' corpora (`node/fuzz/corpus/TARGET/`), replayed on stable as an ordinary
//! test: every input libFuzzer kept, and the seeds (real encodings of each kind), still goes
//! through its decoder without a panic. `node/fuzz/README.md` says how to fuzz by hand.

use std::path::{Path, PathBuf};

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("corpus").join(name)
}

#[test]
fn every_fuzz_corpus_replays_without_a_panic() {
    let mut total = 0;
    for (name, decode) in metatopia_node::fuzzing::TARGETS {
        let files: Vec<PathBuf> = std::fs::read_dir(corpus(name))
            .unwrap_or_else(|e| panic!("no corpus for {name} ({e}): fuzz it, or run the seed writer below"))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!files.is_empty(), "the corpus of {name} is empty");
        for f in &files {
            decode(&std::fs::read(f).unwrap());
        }
        total += files.len();
    }
    assert!(total >= metatopia_node::fuzzing::TARGETS.len());
}

/// Real encodings of each kind, as the starting points of the corpora.
#[test]
#[ignore = "writes seed inputs into node/fuzz/corpus (run by hand: cargo test --test fuzz_corpus -- --ignored)"]
fn write_seed_corpora() {
    use metatopia_sim::genesis::{DemoSpec, demo_key, demo_world};
    use metatopia_sim::{Payload, SignedEvent, SimId};
    let write = |name: &str, seed: &str, bytes: &[u8]| {
        std::fs::create_dir_all(corpus(name)).unwrap();
        std::fs::write(corpus(name).join(format!("seed-{seed}")), bytes).unwrap();
    };
    let key = demo_key(1, 1);
    let login = SignedEvent::new(&key, SimId(1), 1, Payload::Login { name: "ada".into() });
    write("signed_event", "login", &metatopia_sim::codec::encode(&login));
    let chat = SignedEvent::new(
        &key,
        SimId(1),
        2,
        Payload::Chat { channel: 0, range: metatopia_sim::ChatRange::Say, text: "hello".into() },
    );
    write("signed_event", "chat", &metatopia_sim::codec::encode(&chat));
    let demo = demo_world(DemoSpec { seed: 3, objects: 5, players: 2, ..DemoSpec::default() });
    let mut world = demo.world.clone();
    world.set_genesis_validators((0..4u64).map(|i| metatopia_sim::event::account_of(&demo_key(9, i))));
    let g = metatopia_node::world::genesis::Genesis::of_world(world, "kinematic", 1, Vec::new()).unwrap();
    write("genesis", "small", &g.bytes);
    write("snapshot", "small", &g.snapshot.encode());
    let msg = metatopia_node::net::wire::NodeMsg::SimInfoRequest;
    write("node_message", "sim-info-request", &msg.encode());
    let msg = metatopia_node::net::wire::NodeMsg::Snapshot { tick: metatopia_sim::Tick(0), bytes: g.snapshot.encode() };
    write("node_message", "snapshot", &msg.encode());
    let mut state = rhai::Map::new();
    state.insert("n".into(), 5i64.into());
    state.insert("a".into(), rhai::Dynamic::from_array(vec!["x".into(), true.into()]));
    write("script_state", "map", &metatopia_scripting::persist::encode(&state).unwrap());
    let route = metatopia_client::proto::ClientMsg::Route { account: "ab".repeat(32) };
    write("client_frame", "route", &postcard::to_allocvec(&route).unwrap());
    write("client_json", "route", serde_json::to_string(&route).unwrap().as_bytes());
    let dir = std::env::temp_dir().join(format!("metatopia-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = metatopia_node::store::DataDir::open(&dir).unwrap();
    let mut j = metatopia_node::store::StateJournal::open(&data).unwrap();
    j.write(b"first state").unwrap();
    j.write(b"second state").unwrap();
    write("journal", "two", &std::fs::read(dir.join("consensus.journal")).unwrap());
    let (mut log, _) = metatopia_node::store::CommitLog::open(&data.log_dir(), metatopia_sim::Tick(0)).unwrap();
    for tick in 0..3 {
        let rec = metatopia_node::store::LogRecord {
            tick: metatopia_sim::Tick(tick),
            time_ms: tick * 50,
            seed: [1; 32],
            events: vec![metatopia_sim::codec::encode(&login)],
            certificate: vec![2; 16],
            opener: None,
        };
        log.append(&rec).unwrap();
    }
    drop(log);
    write("log_segment", "three", &std::fs::read(data.log_dir().join("000000000000.seg")).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    let fetch = metatopia_consensus::Message::Fetch(metatopia_consensus::Digest([7; 32]));
    write("consensus_message", "fetch", &fetch.encode());
    let events = metatopia_consensus::Message::Events(vec![metatopia_sim::codec::encode(&login).into()]);
    write("consensus_message", "events", &events.encode());
    let mail = metatopia_sim::links::MailBody {
        physics: vec![1, 2, 3],
        records: Vec::new(),
        validators: vec![metatopia_sim::event::account_of(&key)],
    };
    write("mail", "empty", &mail.encode());
}
