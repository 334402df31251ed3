//! Clients end to end: four real `metatopia run` processes on loopback (the plaza world), and
//! native clients over QUIC with each node's key pinned. A client is routed to a node of its sim;
//! moves are committed and seen by others; whisper and say carry 10 and 20 metres; touching the
//! door opens it; script source is readable; forged and replayed inputs are refused; garbage and
//! flooding clients are cut off while the sim ticks on; a client whose node dies moves to another
//! node of the sim with its avatar intact.
use crate::support;

use std::time::{Duration, Instant};

use metatopia_client::proto::{ClientMsg, NodeAddr, ServerMsg, read_frame, write_frame};
use metatopia_client::{ActError, Client, View};
use metatopia_sim::SigningKey;
use metatopia_sim::event::{ChatRange, Payload};

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn x_of(view: &View, account: &str) -> Option<i64> {
    view.avatar_of(account).and_then(|a| view.metres_of(&a.id)).map(|p| p[0])
}

fn heard(view: &View, text: &str) -> usize {
    view.chat.iter().filter(|c| c.text == text).count()
}

/// A raw QUIC session to a node (for misbehaving on purpose).
async fn raw(node: &NodeAddr) -> (quinn::Connection, quinn::SendStream, quinn::RecvStream) {
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(
        metatopia_client::quic::client_config(metatopia_client::quic::parse_public(&node.key).unwrap()).unwrap(),
    );
    let conn = ep.connect(node.addr.parse().unwrap(), metatopia_client::quic::SERVER_NAME).unwrap().await.unwrap();
    let (send, recv) = conn.open_bi().await.unwrap();
    (conn, send, recv)
}

/// Read until an error message arrives, then expect the stream to end: the node cut us off.
async fn expect_cut_off(recv: &mut quinn::RecvStream, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "not cut off ({why})");
        match tokio::time::timeout(Duration::from_secs(10), read_frame::<ServerMsg, _>(recv, 1 << 24)).await {
            Ok(Ok(ServerMsg::Error { message, .. })) if message.contains("disconnected") => {
                assert!(message.contains(why) && message.contains("disconnected"), "{message}");
                break;
            }
            Ok(Ok(_)) => continue,
            other => panic!("expected an error about {why}, got {other:?}"),
        }
    }
    let end = tokio::time::timeout(Duration::from_secs(10), read_frame::<ServerMsg, _>(recv, 1 << 24)).await.unwrap();
    assert!(end.is_err(), "the stream goes on after the cut-off: {end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_walk_chat_touch_read_scripts_and_fail_over_on_real_nodes() {
    let mut cluster = support::Cluster::start("clients", "plaza.toml");
    let join: Vec<NodeAddr> = cluster.join.iter().map(|j| j.parse().unwrap()).collect();

    // Any node routes a client to the sim's nodes; clients spread over them by account.
    let mut ada = Client::connect(&join[0], key(1)).await.unwrap();
    let mut bob = Client::connect(&join[2], key(2)).await.unwrap();
    let mut cy = Client::connect(&join[1], key(3)).await.unwrap();
    let listed: Vec<(&str, &str)> = ada.nodes().iter().map(|n| (n.key.as_str(), n.addr.as_str())).collect();
    let joined: Vec<(&str, &str)> = join.iter().map(|n| (n.key.as_str(), n.addr.as_str())).collect();
    assert_eq!(listed, joined, "the route lists the sim's nodes");
    assert!(ada.nodes().iter().all(|n| n.http.is_some()), "with their HTTP addresses, for the viewer");
    let on: Vec<usize> = [&ada, &bob, &cy]
        .iter()
        .map(|c| join.iter().position(|j| Some(&j.key) == c.node().map(|n| &n.key)).expect("on a node of the sim"))
        .collect();
    let mut spread = std::collections::BTreeSet::new();
    for n in 10..22u8 {
        let c = Client::connect(&join[0], key(n)).await.unwrap();
        spread.insert(c.node().unwrap().key.clone());
    }
    assert!(spread.len() >= 3, "twelve clients bootstrapped through node 0 use {} nodes", spread.len());
    assert_eq!(ada.sim(), cluster.status(0).unwrap().sim);
    for (c, name) in [(&mut ada, "ada"), (&mut bob, "bob"), (&mut cy, "cy")] {
        c.login(name).await.unwrap_or_else(|e| panic!("{name} logs in: {e}"));
    }
    let (a, b, c) = (ada.account().to_string(), bob.account().to_string(), cy.account().to_string());
    // Everyone arrives at the plaza, in each other's area of interest.
    for who in [&a, &b, &c] {
        assert!(bob.run_until(Duration::from_secs(10), |v, _| v.avatar_of(who).is_some()).await, "bob sees {who}");
    }

    // cy walks east; bob, on another node, sees it move; cy stops 12..20 m from ada.
    let start_x = x_of(bob.view(), &c).unwrap();
    cy.walk(4, 0).await.unwrap();
    assert!(cy.run_until(Duration::from_secs(15), |v, _| x_of(v, &c).is_some_and(|x| x >= start_x + 12)).await);
    cy.walk(0, 0).await.unwrap();
    // A stop that executed late (a loaded machine) leaves cy further east: it walks back.
    if x_of(cy.view(), &c).unwrap() > start_x + 18 {
        cy.walk(-2, 0).await.unwrap();
        assert!(cy.run_until(Duration::from_secs(15), |v, _| x_of(v, &c).is_some_and(|x| x <= start_x + 16)).await);
        cy.walk(0, 0).await.unwrap();
    }
    let cy_x = x_of(cy.view(), &c).unwrap();
    assert!(cy_x < start_x + 19, "cy stopped at {cy_x}, too far for the chat check");
    assert!(
        bob.run_until(Duration::from_secs(10), |v, _| x_of(v, &c).is_some_and(|x| x >= start_x + 12)).await,
        "bob sees cy's committed move"
    );

    // Whisper carries 10 m: bob (next to ada) hears it, cy (12+ m away) does not; say carries 20 m.
    ada.chat(0, ChatRange::Whisper, "psst").await.unwrap();
    assert!(bob.run_until(Duration::from_secs(10), |v, _| heard(v, "psst") > 0).await, "bob hears the whisper");
    ada.say(0, "hello all").await.unwrap();
    assert!(cy.run_until(Duration::from_secs(10), |v, _| heard(v, "hello all") > 0).await, "cy hears the say");
    assert_eq!(heard(cy.view(), "psst"), 0, "cy is out of whisper range");

    // Touching the door opens it, for everyone: its text and its line.
    let door = bob.view().objects.values().find(|o| o.name == "door").expect("the door is in view").id.clone();
    ada.touch(&door).await.unwrap();
    assert!(
        bob.run_until(Duration::from_secs(10), |v, _| v.objects.get(&door).is_some_and(|o| o.text == "door: open"))
            .await,
        "bob sees the door open"
    );
    assert!(bob.run_until(Duration::from_secs(5), |v, _| heard(v, "The door opens.") > 0).await);
    // Anyone can read its script: source, licence, author.
    let seen = cy.object(&door).await.unwrap().expect("the door");
    let script = seen.script.expect("the door's script");
    assert!(script.source.contains("fn on_touch") && script.licence == "AGPL-3.0-or-later", "{script:?}");

    // A forged signature is refused at the door; a replayed event never takes effect twice.
    let mut forged =
        ada.sign(Payload::Chat { channel: 0, range: ChatRange::Say, text: "forged".into() }).await.unwrap();
    forged.signature.0[0] ^= 1;
    match ada.submit_signed(&forged).await {
        Err(ActError::NotSubmitted(why)) => assert!(why.contains("signature"), "{why}"),
        other => panic!("a forged event was taken: {other:?}"),
    }
    let once = ada.sign(Payload::Chat { channel: 0, range: ChatRange::Say, text: "only once".into() }).await.unwrap();
    let id = ada.submit_signed(&once).await.unwrap();
    ada.outcome(&id, Duration::from_secs(15)).await.unwrap();
    assert!(bob.run_until(Duration::from_secs(10), |v, _| heard(v, "only once") > 0).await);
    let _ = ada.submit_signed(&once).await; // taken or refused: it must not take effect again
    let until = bob.view().tick + 40;
    assert!(bob.run_until(Duration::from_secs(15), |v, _| v.tick >= until).await);
    assert_eq!(heard(bob.view(), "only once"), 1, "the replay was said again");
    assert_eq!(heard(bob.view(), "forged"), 0);

    // Garbage and flooding cut a client off; the sim ticks on at its rate and others see it.
    let before = cluster.status(0).unwrap().tick;
    let t0 = Instant::now();
    let (_g, mut send, mut recv) = raw(&join[0]).await;
    send.write_all(&[0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]).await.unwrap();
    expect_cut_off(&mut recv, "not a message").await;
    let (_f, mut send, mut recv) = raw(&join[0]).await;
    for r in 0..200u64 {
        if write_frame(&mut send, &ClientMsg::Submit { r#ref: r, event: "00".into() }).await.is_err() {
            break;
        }
    }
    expect_cut_off(&mut recv, "events a second").await;
    let (_big, mut send, mut recv) = raw(&join[0]).await;
    send.write_all(&(64u32 << 20).to_be_bytes()).await.unwrap();
    expect_cut_off(&mut recv, "over the limit").await;
    let seen_before = ada.view().tick;
    assert!(ada.run_until(Duration::from_secs(10), |v, _| v.tick >= seen_before + 20).await, "ada's deltas go on");
    // Over at least three seconds from the first misbehaving client.
    tokio::time::sleep_until((t0 + Duration::from_secs(3)).into()).await;
    let after = cluster.status(0).unwrap().tick;
    let expected = t0.elapsed().as_secs_f64() * 20.0;
    assert!(
        after.since(before) as f64 >= expected * 0.6,
        "the sim slowed: {} ticks in {:.1} s at 20 Hz",
        after.since(before),
        t0.elapsed().as_secs_f64()
    );

    // The admin kicks cy: cy's session is closed and it does not fail over; logging in again is
    // refused during the cooldown. (The plaza world's admin is the seeded demo admin.)
    let admin_key = metatopia_sim::genesis::demo_key(1, 0);
    let gov: metatopia_node::api::http::GovernanceView =
        metatopia_node::api::http::Client::new(&cluster.http[0]).get("/v1/governance").unwrap().unwrap();
    assert_eq!(gov.admin, metatopia_sim::event::account_of(&admin_key).to_string());
    let mut boss = Client::connect(&join[3], admin_key).await.unwrap();
    let cy_id = metatopia_sim::AccountId(metatopia_node::api::http::parse_hash(&c).unwrap());
    boss.act(Payload::Admin(metatopia_sim::AdminAct::Kick { account: cy_id })).await.unwrap();
    let t0 = Instant::now();
    while cy.next().await.is_some() {
        assert!(t0.elapsed() < Duration::from_secs(15), "cy's session stays open after the kick");
    }
    assert!(cy.closed().is_some_and(|why| why.contains("kicked")), "{:?}", cy.closed());
    assert_eq!(cy.failovers, 0);
    let mut cy_again = Client::connect(&join[1], key(3)).await.unwrap();
    match cy_again.login("cy").await {
        Err(ActError::Refused { reason, .. }) => assert!(reason.contains("kicked"), "{reason}"),
        other => panic!("a kicked account logged in again: {other:?}"),
    }
    assert!(ada.run_until(Duration::from_secs(10), |v, _| v.avatar_of(&c).is_none()).await, "cy's avatar is gone");

    // bob's node dies: bob moves to another node of the sim, avatar and all.
    let tick = cluster.status((on[1] + 1) % 4).unwrap().tick;
    cluster.nodes[on[1]] = None;
    assert!(
        bob.run_until(Duration::from_secs(30), |v, _| v.tick >= tick + 40 && v.avatar_of(&b).is_some()).await,
        "bob goes on after its node died"
    );
    // (Moved when its connection timed out, or when a probe of the sim's nodes found it gone.)
    assert!(bob.failovers + bob.nearer_moves >= 1, "bob never moved");
    assert_ne!(bob.node().map(|n| &n.key), Some(&join[on[1]].key));
    // ... and acts from there.
    bob.say(0, "still here").await.unwrap();
    assert!(ada.run_until(Duration::from_secs(10), |v, _| heard(v, "still here") > 0).await);
    assert!(ada.view().avatar_of(&b).is_some() && ada.view().avatar_of(&a).is_some());
}

/// A node whose loop is too busy to answer a question in time says so ("busy: ask again"),
/// and the client asks again: the avatar asked for while the node was busy comes back, never
/// "no avatar" (a crowd's logins read a busy node that way and gave up). The node's client
/// service runs here on its own, its loop a task that lets every second question about an
/// account go unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_asks_a_busy_node_again_and_gets_its_answer() {
    use metatopia_node::api::http::{AccountView, Query, Service};
    use std::sync::atomic::{AtomicU32, Ordering};
    let node_key = key(9);
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let me = NodeAddr {
        key: metatopia_sim::ids::hex(node_key.verifying_key().as_bytes()),
        addr: format!("127.0.0.1:{port}"),
        http: None,
    };
    let hub = std::sync::Arc::new(metatopia_node::api::hub::Hub::new(1, vec![me.clone()]));
    let (_status_tx, status) = tokio::sync::watch::channel(metatopia_client::proto::Status::default());
    let (queries, mut asked) = tokio::sync::mpsc::channel(64);
    let accounts = std::sync::Arc::new(AtomicU32::new(0));
    let counted = accounts.clone();
    tokio::spawn(async move {
        while let Some(q) = asked.recv().await {
            match q {
                // Every second question about an account: the loop never gets to it.
                Query::Account(_, tx) if counted.fetch_add(1, Ordering::Relaxed) % 2 == 1 => drop(tx),
                Query::Account(id, tx) => {
                    let _ = tx.send(Some(AccountView {
                        id: id.to_string(),
                        name: "ann".into(),
                        joined_at_ms: 0,
                        last_login_ms: 0,
                        last_nonce: 0,
                        role: "member".into(),
                        banned: false,
                        kicked_until_ms: None,
                        avatar: Some("5v0".into()),
                        returned: Vec::new(),
                    }));
                }
                Query::Locate(_, tx) => {
                    let _ = tx.send(None);
                }
                _ => {}
            }
        }
    });
    let service = Service { status, queries, metrics: None, started: Instant::now(), hub: Some(hub) };
    let rt = tokio::runtime::Handle::current();
    let (_endpoint, _task) =
        metatopia_node::api::gateway::serve_quic(&rt, me.addr.parse().unwrap(), &node_key, service).unwrap();
    let mut c = Client::connect(&me, key(10)).await.expect("connects");
    let before = accounts.load(Ordering::Relaxed);
    let avatar = c.avatar().await.expect("an answer, after asking again");
    assert_eq!(avatar.map(|a| a.to_string()), Some("5v0".to_string()));
    assert_eq!(accounts.load(Ordering::Relaxed) - before, 2, "asked once, told busy, asked again");
}
