use super::*;
use metatopia_client::proto::ObjectView;

fn obj(id: &str, owner: &str, avatar: bool, x: i64, y: i64) -> ObjectView {
    ObjectView {
        id: id.into(),
        name: id.into(),
        owner: owner.into(),
        avatar,
        position: [x.to_string(), y.to_string()],
        velocity: ["0".into(), "0".into()],
        shape: "circle 0.5".into(),
        color: "ffffffff".into(),
        text: String::new(),
        script: None,
        scripted: false,
        body: "static".into(),
        surface: String::new(),
    }
}

/// In a crowd the area is the nearest objects, in key order, ties to the smaller key.
#[test]
fn an_area_in_a_crowd_is_its_nearest_objects() {
    let mut index = AoiIndex::default();
    let views = (0..40).map(|i| {
        // Forty objects on a line from x = 100 (every other one at the same distance on the
        // other side of the centre, x = 120).
        let x = if i % 2 == 0 { 120 + i / 2 } else { 120 - (i + 1) / 2 };
        obj(&format!("{i}v0"), "cc", false, x, 50)
    });
    index.update(Tick(1), views);
    let mut out = Vec::new();
    index.nearest([120, 50], 100, 5, &mut out);
    let key = |i: u64| i << 32;
    // Distance 0: object 0; 1: objects 1 and 2; 2: objects 3 and 4.
    assert_eq!(out, [0, 1, 2, 3, 4].map(key));
    index.nearest([120, 50], 100, 4, &mut out);
    assert_eq!(out, [0, 1, 2, 3].map(key), "a tie goes to the smaller key");
    index.nearest([120, 50], 100, 100, &mut out);
    assert_eq!(out.len(), 40, "fewer than the most: all within the radius");
    index.nearest([120, 50], 3, 100, &mut out);
    assert_eq!(out, [0, 1, 2, 3, 4, 5, 6].map(key), "and never one beyond it");
}

/// The index keeps its objects by slot: a slot's next object (a new generation) takes the
/// old one's place whole, its cell and its avatar entry, and a client that knew the old one
/// is told it left and the new one entered.
#[test]
fn a_slot_reused_by_a_new_object_replaces_the_old_one_everywhere() {
    let (a, b) = ("aa".repeat(32), "bb".repeat(32));
    let mut index = AoiIndex { radius_m: 30, ..AoiIndex::default() };
    index.update(Tick(1), [obj("0v0", &b, true, 10, 10), obj("3v0", &a, true, 12, 10)].into_iter());
    let mut view = View { follow: Some(b.clone()), ..View::default() };
    let ServerMsg::Tick { enter, .. } = view.delta(&index) else { panic!() };
    assert_eq!(enter.len(), 2);
    // Slot 3's avatar left and a prim took the slot, far away.
    index.update(Tick(1 + AREA_EVERY), [obj("0v0", &b, true, 10, 10), obj("3v1", "x", false, 500, 500)].into_iter());
    assert_eq!((index.len(), index.get(3 << 32), index.avatar_at(&a)), (2, None, None));
    assert_eq!(index.get((3 << 32) | 1).map(|v| v.id), Some("3v1".to_owned()));
    let mut near = Vec::new();
    index.within([12, 10], 5, &mut near);
    assert_eq!(near, [0], "the old avatar's cell entry went with it");
    let ServerMsg::Tick { enter, leave, .. } = view.delta(&index) else { panic!() };
    assert_eq!((enter.len(), leave), (0, vec!["3v0".to_string()]));
    // The world shrank: the slots' room goes back, the keys stay in order.
    index.update(Tick(2 + AREA_EVERY), [obj("0v0", &b, true, 10, 10)].into_iter());
    let mut all = Vec::new();
    index.all(&mut all);
    assert_eq!((all, index.objects.slots.len()), (vec![0], 1));
}

#[test]
fn the_area_of_interest_follows_the_avatar_with_enter_update_leave() {
    let me = "aa".repeat(32);
    let mut index = AoiIndex { radius_m: 30, ..AoiIndex::default() };
    let world = |me_x: i64, door_text: &str| {
        let mut door = obj("1v0", "x", false, 100, 100);
        door.text = door_text.into();
        vec![obj("0v0", &me, true, me_x, 100), door, obj("2v0", "x", false, 200, 100), obj("3v0", "x", false, 125, 118)]
    };
    let changed = index.update(Tick(1), world(90, "closed").into_iter());
    assert!(changed.is_empty(), "new objects are not changes");
    let mut view = View { follow: Some(me.clone()), ..View::default() };
    let ServerMsg::Tick { enter, leave, .. } = view.delta(&index) else { panic!() };
    let ids: Vec<&str> = enter.iter().map(|o| o.id.as_str()).collect();
    // 3v0 is 35 x 18 m away (39 m): outside 30 m; 2v0 far away.
    assert_eq!(ids, ["0v0", "1v0"]);
    assert!(leave.is_empty());
    // The door opens: an update; I walk east 20 m: 3v0 enters (15 m), nothing leaves.
    // (Areas are recomputed every AREA_EVERY ticks.)
    let changed = index.update(Tick(1 + AREA_EVERY), world(110, "open").into_iter());
    assert_eq!(changed.iter().map(|(_, u)| u.id.as_str()).collect::<Vec<_>>(), ["0v0", "1v0"]);
    assert_eq!(changed.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [0, 1 << 32]);
    let ServerMsg::Tick { tick, enter, update, leave } = view.delta(&index) else { panic!() };
    assert_eq!(tick, Tick(1 + AREA_EVERY));
    assert_eq!(enter.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["3v0"]);
    assert_eq!(update.len(), 2);
    assert_eq!(
        (update[0].id.as_str(), update[0].at_mm, update[0].text.clone()),
        ("0v0", Some([110_000, 100_000]), None)
    );
    assert_eq!((update[1].id.as_str(), update[1].at_mm, update[1].text.as_deref()), ("1v0", None, Some("open")));
    assert!(leave.is_empty());
    // Far east: everything but 2v0 leaves and 2v0 enters; a removed object leaves too.
    let mut w = world(190, "open");
    w.remove(3);
    index.update(Tick(1 + 2 * AREA_EVERY), w.into_iter());
    let ServerMsg::Tick { enter, leave, .. } = view.delta(&index) else { panic!() };
    assert_eq!(enter.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["2v0"]);
    assert_eq!(leave, ["1v0", "3v0"]);
    assert_eq!(index.len(), 3);
    // Chat: heard within its range of the avatar, private lines only by their account.
    let line = |x: i64, range_m: u32, to: Option<String>| ChatView {
        tick: Tick(3),
        name: "n".into(),
        channel: 0,
        text: "t".into(),
        position: [x, 100],
        range_m,
        to,
    };
    assert!(view.hears(&line(175, 20, None), &index));
    assert!(!view.hears(&line(165, 20, None), &index));
    assert!(view.hears(&line(100, 100, None), &index));
    // A line for `me` reaches this session only once it proved it holds `me`'s key (an
    // event of `me`'s taken in); following `me` is not enough.
    assert!(!view.hears(&line(0, 10, Some(me.clone())), &index));
    view.authors.insert(me.clone());
    assert!(view.hears(&line(0, 10, Some(me.clone())), &index));
    assert!(!view.hears(&line(190, 10, Some("bb".repeat(32))), &index));
    // Without an interest: the whole sim, every public line.
    let mut all = View::default();
    let ServerMsg::Tick { enter, .. } = all.delta(&index) else { panic!() };
    assert_eq!(enter.len(), 3);
    assert!(all.hears(&line(-1000, 10, None), &index));
}

/// Deltas come from the index alone: a session that skips ticks (a slow client, or one
/// asking for fewer deltas) still ends with every object as it is. A session that had the
/// object's fields before their last change gets that change; one further behind gets the
/// fields whole.
#[test]
fn a_session_that_skips_ticks_gets_what_changed_since_its_last_delta() {
    let me = "aa".repeat(32);
    let mut index = AoiIndex { radius_m: 1000, rate_hz: 20, ..AoiIndex::default() };
    let world = |text: &str, color: &str| {
        let mut door = obj("1v0", "x", false, 5, 5);
        (door.text, door.color) = (text.into(), color.into());
        vec![obj("0v0", &me, true, 0, 0), door].into_iter()
    };
    let new = || View { follow: Some(me.clone()), ..View::default() };
    let (mut quick, mut slow) = (new(), new());
    let (mut qc, mut sc) = (metatopia_client::View::default(), metatopia_client::View::default());
    index.update(Tick(1), world("closed", "ffffffff"));
    qc.apply(&quick.delta(&index));
    sc.apply(&slow.delta(&index));
    index.update(Tick(2), world("open", "ffffffff"));
    qc.apply(&quick.delta(&index));
    index.update(Tick(3), world("open", "00ff00ff"));
    // The quick one had tick 2: the recolouring alone.
    let m = quick.delta(&index);
    let ServerMsg::Tick { update, .. } = &m else { panic!() };
    assert_eq!(update.len(), 1, "{update:?}");
    assert_eq!((update[0].color.as_deref(), update[0].text.as_deref()), (Some("00ff00ff"), None));
    qc.apply(&m);
    // The slow one last had tick 1: both changes, as the fields whole.
    let m = slow.delta(&index);
    let ServerMsg::Tick { update, enter, leave, .. } = &m else { panic!() };
    assert!(enter.is_empty() && leave.is_empty(), "no start over: {m:?}");
    assert_eq!((update[0].color.as_deref(), update[0].text.as_deref()), (Some("00ff00ff"), Some("open")));
    sc.apply(&m);
    for c in [&qc, &sc] {
        assert_eq!(c.objects.get("1v0"), index.get(1 << 32).as_ref(), "the client's door is the index's");
    }
    // Nothing changed since: an empty delta for both.
    index.update(Tick(4), world("open", "00ff00ff"));
    for v in [&mut quick, &mut slow] {
        let ServerMsg::Tick { update, enter, leave, .. } = v.delta(&index) else { panic!() };
        assert!(update.is_empty() && enter.is_empty() && leave.is_empty());
    }
}

/// One tick: the world is `me` and the ball; the node's delta goes to a real client view.
fn step(
    index: &mut AoiIndex,
    view: &mut View,
    client: &mut metatopia_client::View,
    tick: u64,
    ball: ObjectView,
) -> usize {
    let me = "aa".repeat(32);
    index.update(Tick(tick), vec![obj("0v0", &me, true, 0, 0), ball].into_iter());
    let m = view.delta(index);
    let ServerMsg::Tick { update, .. } = &m else { panic!() };
    let n = update.iter().filter(|u| u.at_mm.is_some()).count();
    client.apply(&m);
    n
}

#[test]
fn motion_is_dead_reckoned_corrected_when_it_drifts_and_stopped_explicitly() {
    let mut index = AoiIndex { radius_m: 1000, rate_hz: 20, ..AoiIndex::default() };
    // A ball rolling east at 1 m/s (50 mm a tick at 20 Hz), from x = 10 m.
    let ball = |x_mm: i64, v_mm: i64| {
        let mut b = obj("1v0", "x", false, 0, 0);
        b.position = [proto::decimal_of_mm(x_mm), "0".into()];
        b.velocity = [proto::decimal_of_mm(v_mm), "0".into()];
        b
    };
    let mut view = View { follow: Some("aa".repeat(32)), ..View::default() };
    let mut client = metatopia_client::View::default();
    let x = |c: &metatopia_client::View| c.position_mm("1v0").unwrap()[0];
    let mut sent = step(&mut index, &mut view, &mut client, 1, ball(10_000, 1000));
    for t in 2..=40 {
        sent += step(&mut index, &mut view, &mut client, t, ball(10_000 + 50 * (t as i64 - 1), 1000));
        assert_eq!(x(&client), 10_000 + 50 * (t as i64 - 1), "the client's extrapolation at tick {t}");
    }
    assert_eq!(sent, 0, "steady motion needs no position updates");
    // A bump: 150 mm further than the extrapolation, same velocity: corrected once.
    let x41 = 10_000 + 50 * 40 + 150;
    assert_eq!(step(&mut index, &mut view, &mut client, 41, ball(x41, 1000)), 1);
    assert_eq!(x(&client), x41);
    // A small drift (60 mm) is left to the extrapolation; a velocity change is sent.
    assert_eq!(step(&mut index, &mut view, &mut client, 42, ball(x41 + 50 + 60, 1000)), 0);
    assert_eq!(x(&client), x41 + 50);
    assert_eq!(step(&mut index, &mut view, &mut client, 43, ball(x41 + 200, 2000)), 1);
    // Stopping is always sent, so clients stop extrapolating.
    assert_eq!(step(&mut index, &mut view, &mut client, 44, ball(x41 + 250, 0)), 1);
    assert_eq!(step(&mut index, &mut view, &mut client, 45, ball(x41 + 250, 0)), 0);
    assert_eq!(x(&client), x41 + 250);
}

#[test]
fn the_grid_query_matches_a_scan_of_every_object() {
    let mut index = AoiIndex::default();
    let mut seed = 12345u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) % 600) as i64 - 300
    };
    let objects: Vec<ObjectView> = (0..500).map(|i| obj(&format!("{i}v0"), "o", false, next(), next())).collect();
    index.update(Tick(1), objects.clone().into_iter());
    for _ in 0..50 {
        let (c, r) = ([next(), next()], (next().unsigned_abs() % 120) as u32);
        let scan: BTreeSet<String> = objects
            .iter()
            .filter(|o| {
                let p = o.metres();
                (p[0] - c[0]).pow(2) + (p[1] - c[1]).pow(2) <= i64::from(r).pow(2)
            })
            .map(|o| o.id.clone())
            .collect();
        let scan: Vec<u64> = scan.iter().filter_map(|id| key_of(id)).collect::<BTreeSet<u64>>().into_iter().collect();
        let mut within = Vec::new();
        index.within(c, r, &mut within);
        assert_eq!(within, scan, "center {c:?} radius {r}");
    }
}

/// A transport of two channels: what the test sends the session, and what it answers.
struct Pipe(mpsc::Receiver<ClientMsg>, mpsc::Sender<ServerMsg>);

impl Transport for Pipe {
    async fn recv(&mut self) -> Option<Result<ClientMsg, String>> {
        self.0.recv().await.map(Ok)
    }
    async fn send(&mut self, m: &ServerMsg) -> bool {
        self.1.send(m.clone()).await.is_ok()
    }
}

/// After a failover to a node nobody listened on (so nobody kept its area index), the
/// session waits for the loop to refill the index before it sends the area and replays the
/// recent chat its avatar hears: the line said meanwhile is not lost.
#[tokio::test]
async fn a_session_on_a_node_nobody_listened_on_gets_the_chat_said_meanwhile() {
    let me = "aa".repeat(32);
    let hub = std::sync::Arc::new(Hub::new(1, Vec::new()));
    let (_status_tx, status) =
        tokio::sync::watch::channel(proto::Status { tick: Tick(700), ..proto::Status::default() });
    let (queries, mut asked) = mpsc::channel(8);
    let s = Service { status, queries, metrics: None, started: Instant::now(), hub: Some(hub.clone()) };
    let line = ChatView {
        tick: Tick(699),
        name: "bob".into(),
        channel: 0,
        text: "still here".into(),
        position: [101, 100],
        range_m: 20,
        to: None,
    };
    // The node's loop: the line was said while nobody listened (and so was one too long
    // ago, and one meant for another account alone); it refills the index at its next tick.
    let looped = hub.clone();
    hub.said(std::sync::Arc::new(ChatView {
        tick: Tick(700 - REPLAY_TICKS - 1),
        text: "too long ago".into(),
        ..line.clone()
    }));
    hub.said(std::sync::Arc::new(line.clone()));
    hub.said(std::sync::Arc::new(ChatView { text: "for bb only".into(), to: Some("bb".repeat(32)), ..line.clone() }));
    tokio::spawn(async move { while asked.recv().await.is_some() {} });
    let (to_session, from_test) = mpsc::channel(8);
    let (to_test, mut answers) = mpsc::channel(64);
    tokio::spawn(session(Pipe(from_test, to_test), s, View::nothing()));
    to_session.send(ClientMsg::Interest { follow: Some(me.clone()), radius_m: None, max_hz: None }).await.unwrap();
    for _ in 0..500 {
        if looped.listened() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(looped.listened(), "the session listens");
    tokio::time::sleep(Duration::from_millis(50)).await;
    {
        let mut index = looped.index.write().unwrap();
        index.radius_m = 30;
        index.update(Tick(701), vec![obj("0v0", &me, true, 100, 100), obj("1v0", "bb", true, 101, 100)].into_iter());
    }
    looped.publish_tick(Tick(701));
    let mut heard = Vec::new();
    // Five seconds for the first line, then half a second for any other.
    let mut wait = Duration::from_secs(5);
    while let Ok(Some(m)) = tokio::time::timeout(wait, answers.recv()).await {
        if let ServerMsg::Chat(c) = m {
            heard.push(c.text);
            wait = Duration::from_millis(500);
        }
    }
    assert_eq!(heard, ["still here"], "the line said while the client failed over");
}

/// A loop too busy to take a question within the wait: the session answers "busy: ask
/// again", never "there is no such account" (a crowd's logins read that as an avatar-less
/// login and gave up); once the loop takes questions again the same question is answered.
#[tokio::test]
async fn a_loop_too_busy_to_answer_is_said_busy_not_no_account() {
    let hub = std::sync::Arc::new(Hub::new(1, Vec::new()));
    let (_status_tx, status) = tokio::sync::watch::channel(proto::Status { tick: Tick(1), ..proto::Status::default() });
    let (queries, mut asked) = mpsc::channel(1);
    // The loop's queue is full, and the loop takes nothing yet.
    queries.try_send(Query::Governance(oneshot::channel().0)).unwrap();
    let s = Service { status, queries, metrics: None, started: Instant::now(), hub: Some(hub) };
    let (to_session, from_test) = mpsc::channel(8);
    let (to_test, mut answers) = mpsc::channel(64);
    tokio::spawn(session(Pipe(from_test, to_test), s, View::nothing()));
    let account = || ClientMsg::Account { id: "aa".repeat(32) };
    let answer = async |answers: &mut mpsc::Receiver<ServerMsg>| loop {
        match tokio::time::timeout(Duration::from_secs(30), answers.recv()).await {
            Ok(Some(m @ (ServerMsg::Account { .. } | ServerMsg::Error { .. }))) => break m,
            Ok(Some(_)) => {}
            other => panic!("no answer: {other:?}"),
        }
    };
    to_session.send(account()).await.unwrap();
    match answer(&mut answers).await {
        ServerMsg::Error { r#ref: None, message } => assert_eq!(message, proto::BUSY),
        other => panic!("a busy loop answered {other:?}"),
    }
    // The loop is back: it answers that there is no such account, now that it looked.
    tokio::spawn(async move {
        while let Some(q) = asked.recv().await {
            if let Query::Account(_, tx) = q {
                let _ = tx.send(None);
            }
        }
    });
    to_session.send(account()).await.unwrap();
    assert!(matches!(answer(&mut answers).await, ServerMsg::Account { account: None, .. }));
}

/// A transport whose deltas take `slow` each to go out (a client that reads slowly, or a
/// congested link); everything else goes out at once. It records what it sent and when.
struct SlowPipe {
    rx: mpsc::Receiver<ClientMsg>,
    sent: std::sync::Arc<std::sync::Mutex<Vec<(tokio::time::Instant, ServerMsg)>>>,
    slow: Duration,
}

impl Transport for SlowPipe {
    async fn recv(&mut self) -> Option<Result<ClientMsg, String>> {
        self.rx.recv().await.map(Ok)
    }
    async fn send(&mut self, m: &ServerMsg) -> bool {
        if matches!(m, ServerMsg::Tick { .. }) {
            tokio::time::sleep(self.slow).await;
        }
        self.sent.lock().unwrap().push((tokio::time::Instant::now(), m.clone()));
        true
    }
}

/// A client slower than the deltas (each takes 300 ms to go out, ticks come every 50 ms): its
/// question is answered after the delta being sent at most, not after a run of them, and the
/// session sends it a delta only as often as they go out (fewer, larger ones: at most one in
/// 600 ms, where it sent one every 300 ms before). Virtual time: no clock is read.
#[tokio::test(start_paused = true)]
async fn a_slow_clients_question_waits_for_one_delta_at_most_and_it_gets_fewer_deltas() {
    let me = "aa".repeat(32);
    let hub = std::sync::Arc::new(Hub::new(1, Vec::new()));
    let (_status_tx, status) = tokio::sync::watch::channel(proto::Status { tick: Tick(1), ..proto::Status::default() });
    let (queries, mut asked) = mpsc::channel(8);
    tokio::spawn(async move {
        while let Some(q) = asked.recv().await {
            if let Query::Account(_, tx) = q {
                let _ = tx.send(None);
            }
        }
    });
    let s = Service { status, queries, metrics: None, started: Instant::now(), hub: Some(hub.clone()) };
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (to_session, rx) = mpsc::channel(8);
    tokio::spawn(session(SlowPipe { rx, sent: sent.clone(), slow: Duration::from_millis(300) }, s, View::nothing()));
    to_session.send(ClientMsg::Interest { follow: Some(me.clone()), radius_m: None, max_hz: None }).await.unwrap();
    // The node's loop: a tick every 50 ms, the avatar walking.
    let ticker = hub.clone();
    tokio::spawn(async move {
        for t in 2..200u64 {
            {
                let mut index = ticker.index.write().unwrap();
                index.update(Tick(t), vec![obj("0v0", &me, true, 100 + t as i64, 100)].into_iter());
            }
            ticker.publish_tick(Tick(t));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked_at = tokio::time::Instant::now();
    to_session.send(ClientMsg::Account { id: "bb".repeat(32) }).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = sent.lock().unwrap();
    let answered =
        sent.iter().position(|(_, m)| matches!(m, ServerMsg::Account { .. })).expect("the question was answered");
    let deltas_between =
        sent[..answered].iter().filter(|(at, m)| *at > asked_at && matches!(m, ServerMsg::Tick { .. })).count();
    assert!(deltas_between <= 1, "{deltas_between} deltas went out before the answer");
    // Deltas from 1 s on (after the first area), over 5 s: one per 600 ms at most.
    let start = asked_at - Duration::from_secs(2);
    let deltas = sent.iter().filter(|(at, m)| *at > start && matches!(m, ServerMsg::Tick { .. })).count();
    assert!((4..=9).contains(&deltas), "{deltas} deltas in 5 s, each taking 300 ms to go out");
}

/// A client frame that arrives in pieces is read whole even when whoever waits for it gives up
/// waiting between the pieces (as a session does whenever a tick comes first): the reading goes
/// on on its own task, and the frames after it keep their framing.
#[tokio::test]
async fn a_frame_in_pieces_survives_the_session_turning_away_between_them() {
    use tokio::io::AsyncWriteExt;
    let (mut client, node) = tokio::io::duplex(1 << 20);
    let mut rx = frames(node);
    let big = ClientMsg::Account { id: "cd".repeat(20_000) };
    let mut bytes = Vec::new();
    proto::write_frame(&mut bytes, &big).await.unwrap();
    proto::write_frame(&mut bytes, &ClientMsg::Ping { r#ref: 7 }).await.unwrap();
    let (first, rest) = bytes.split_at(1_000);
    client.write_all(first).await.unwrap();
    // The session looks for a message and turns away, twice, while the frame is half here.
    for _ in 0..2 {
        assert!(tokio::time::timeout(Duration::from_millis(20), rx.recv()).await.is_err());
    }
    client.write_all(rest).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap().unwrap();
    assert!(matches!(got, ClientMsg::Account { id } if id == "cd".repeat(20_000)));
    let got = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap().unwrap();
    assert!(matches!(got, ClientMsg::Ping { r#ref: 7 }));
    drop(client);
    assert!(tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().is_none(), "the stream ended");
}

/// Around an avatar a delta brings at most ENTER_PER_DELTA new objects, the nearest first (its
/// own avatar among them); the next deltas bring the rest of the area, and then nothing more.
#[test]
fn a_crowded_area_arrives_nearest_first_a_bounded_number_a_delta() {
    let me = "aa".repeat(32);
    let mut index = AoiIndex { radius_m: 200, ..AoiIndex::default() };
    // 150 prims on a line east of the avatar, one metre apart (object i at i + 1 m away).
    let views = std::iter::once(obj("0v0", &me, true, 500, 500))
        .chain((1..=150).map(|i| obj(&format!("{i}v0"), "cc", false, 500 + i, 500)));
    index.update(Tick(1), views);
    let mut view = View { follow: Some(me.clone()), ..View::default() };
    let ids = |enter: &[ObjectView]| enter.iter().map(|o| o.id.clone()).collect::<Vec<_>>();
    let ServerMsg::Tick { enter, .. } = view.delta(&index) else { panic!() };
    assert_eq!(
        ids(&enter),
        (0..ENTER_PER_DELTA).map(|i| format!("{i}v0")).collect::<Vec<_>>(),
        "its avatar and the nearest"
    );
    assert!(view.backlog);
    let ServerMsg::Tick { enter, leave, .. } = view.delta(&index) else { panic!() };
    assert_eq!(ids(&enter), (ENTER_PER_DELTA..2 * ENTER_PER_DELTA).map(|i| format!("{i}v0")).collect::<Vec<_>>());
    assert!(leave.is_empty());
    let ServerMsg::Tick { enter, .. } = view.delta(&index) else { panic!() };
    assert_eq!(ids(&enter), (2 * ENTER_PER_DELTA..=150).map(|i| format!("{i}v0")).collect::<Vec<_>>(), "the rest");
    assert!(!view.backlog);
    let ServerMsg::Tick { enter, update, leave, .. } = view.delta(&index) else { panic!() };
    assert!(enter.is_empty() && update.is_empty() && leave.is_empty(), "nothing more: {enter:?} {update:?} {leave:?}");
    assert_eq!(view.known.len(), 151);
    // A view of the whole sim (no avatar followed) takes the whole area at once.
    let mut all = View::default();
    let ServerMsg::Tick { enter, .. } = all.delta(&index) else { panic!() };
    assert_eq!((enter.len(), all.backlog), (151, false));
}
