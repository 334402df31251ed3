//! A creator's path on four real nodes, through the command line only: rez an object, deploy a
//! script from a file, touch it and read the text it sets, fork the script, edit and redeploy
//! it, and read its provenance back; and the refusals a creator meets, each with its reason.

use std::time::{Duration, Instant};

use metatopia_node::api::http::{Client, ObjectView};

use crate::support::{self, ok, refused};

fn text_of(http: &str, id: &str) -> Option<String> {
    Client::new(http).get::<ObjectView>(&format!("/v1/objects/{id}")).ok().flatten().map(|o| o.text)
}

fn wait_text(http: &str, id: &str, want: &str) {
    let t0 = Instant::now();
    while text_of(http, id).as_deref() != Some(want) {
        assert!(t0.elapsed() < Duration::from_secs(60), "{id} shows {:?}, not {want:?}", text_of(http, id));
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_creator_rezzes_scripts_forks_and_redeploys_from_the_command_line() {
    let cluster = support::Cluster::start("build", "plaza.toml");
    let dir = cluster.root.join("creator");
    std::fs::create_dir_all(&dir).unwrap();
    // Keys as players make them: from the OS's random source.
    let (me, stranger) = (dir.join("me.key"), dir.join("stranger.key"));
    for k in [&me, &stranger] {
        metatopia_client::keys::write(k, &metatopia_client::keys::generate().unwrap()).unwrap();
    }
    let (me, stranger) = (me.to_str().unwrap(), stranger.to_str().unwrap());
    let (h0, h1) = (cluster.http[0].as_str(), cluster.http[1].as_str());
    let s = cluster.status(0).unwrap();
    let at = format!("{},{}", s.region_origin[0] + s.region_size / 2 + 3, s.region_origin[1] + s.region_size / 2 + 3);

    // Rez: a new account logs in first, then the object is made and its id printed.
    let out = ok(&["object", "rez", "--node", h0, "--key", me, "--name", "lamp", "--at", &at, "--text", "off"]);
    assert!(out.contains("logging in") && out.contains("executed at tick"), "{out}");
    let lamp = out.split("object ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().to_owned();
    assert_eq!(text_of(h1, &lamp).as_deref(), Some("off"), "every node has it");
    let shown = ok(&["object", "show", &lamp, "--node", h1]);
    assert!(shown.contains("static"), "a new object is anchored: {shown}");

    // Edit: a new text and place; it is there on every node, and stays there.
    let s2 = format!("{},{}", s.region_origin[0] + s.region_size / 2 - 4, s.region_origin[1] + s.region_size / 2 + 2);
    let out = ok(&["object", "edit", &lamp, "--node", h0, "--key", me, "--text", "off.", "--at", &s2]);
    assert!(out.contains("executed at tick"), "{out}");
    wait_text(h1, &lamp, "off.");
    let at_of = |h: &str| Client::new(h).get::<ObjectView>(&format!("/v1/objects/{lamp}")).unwrap().unwrap().metres();
    let want = [s.region_origin[0] + s.region_size / 2 - 4, s.region_origin[1] + s.region_size / 2 + 2];
    assert_eq!(at_of(h1), want, "placed where the edit said");
    let surface = ["--friction", "0.5", "--restitution", "0.25", "--damping", "2"];
    ok(&[&["object", "edit", &lamp, "--node", h0, "--key", me][..], &surface[..]].concat());
    let shown = ok(&["object", "show", &lamp, "--node", h1]);
    assert!(shown.contains("friction 0.5 restitution 0.25 damping 2"), "{shown}");
    let err = refused(&[
        "object",
        "edit",
        &lamp,
        "--node",
        h0,
        "--key",
        me,
        "--friction",
        "1",
        "--restitution",
        "1",
        "--damping",
        "500",
    ]);
    assert!(err.contains("damping (0 to 100)"), "{err}");
    let err = refused(&["object", "edit", &lamp, "--node", h0, "--key", me]);
    assert!(err.contains("nothing to change"), "{err}");

    // Deploy a script from a file; touch; the text it sets shows on every node.
    let file = dir.join("lamp.rhai");
    std::fs::write(&file, "fn on_touch(who) { set_text(\"on\"); }\n").unwrap();
    let f = file.to_str().unwrap();
    let out = ok(&["script", "deploy", f, "--object", &lamp, "--node", h1, "--key", me]);
    assert!(out.contains("executed at tick"), "{out}");
    ok(&["object", "touch", &lamp, "--node", h0, "--key", me]);
    wait_text(h1, &lamp, "on");
    let shown = ok(&["script", "show", &lamp, "--node", h0]);
    assert!(
        shown.contains("AGPL-3.0-or-later") && shown.contains("an original") && shown.contains("set_text"),
        "{shown}"
    );
    let original = shown.split("script ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().to_owned();

    // Fork, edit, redeploy: the provenance names the original.
    let forked = dir.join("fork.rhai");
    ok(&["script", "fork", &lamp, "--node", h1, "--out", forked.to_str().unwrap()]);
    let text = std::fs::read_to_string(&forked).unwrap();
    assert!(text.starts_with("// metatopia: derived from script ") && text.contains(&original), "{text}");
    std::fs::write(&forked, text.replace("\"on\"", "\"lit\"")).unwrap();
    let out = ok(&["script", "deploy", forked.to_str().unwrap(), "--object", &lamp, "--node", h0, "--key", me]);
    assert!(out.contains(&format!("derived from script {original}")), "{out}");
    ok(&["object", "touch", &lamp, "--node", h1, "--key", stranger]);
    wait_text(h0, &lamp, "lit");
    let shown = ok(&["script", "show", &lamp, "--node", h1]);
    // The original is on no object any more (the fork replaced it), so the sim no longer holds
    // it: the provenance says so rather than stopping silently.
    assert!(shown.contains(&format!("derived from {original} (not held by this sim)")), "{shown}");

    assert_eq!(at_of(h0), want, "a static object stays where it was put");

    // Refusals, each with its reason: not the owner, not copyleft, not rhai.
    let err = refused(&["script", "deploy", f, "--object", &lamp, "--node", h0, "--key", stranger]);
    assert!(err.contains("refused at tick") && err.contains("not owned by the author"), "{err}");
    let err = refused(&["script", "deploy", f, "--object", &lamp, "--node", h0, "--key", me, "--licence", "MIT"]);
    assert!(err.contains("\"MIT\" is not on the copyleft list"), "{err}");
    std::fs::write(&file, "fn on_touch(who) { set_text(\"on\") ; ; }}\n").unwrap();
    let err = refused(&["script", "deploy", f, "--object", &lamp, "--node", h0, "--key", me]);
    assert!(err.contains("script does not compile") && err.contains("line 1"), "{err}");
    let err = refused(&["object", "derez", &lamp, "--node", h0, "--key", stranger]);
    assert!(err.contains("not owned by the author"), "{err}");
    let err = refused(&["object", "edit", &lamp, "--node", h0, "--key", stranger, "--text", "mine"]);
    assert!(err.contains("not owned by the author"), "{err}");

    // Derez by its owner: gone from every node.
    ok(&["object", "derez", &lamp, "--node", h0, "--key", me]);
    let t0 = Instant::now();
    while text_of(h1, &lamp).is_some() {
        assert!(t0.elapsed() < Duration::from_secs(60), "{lamp} still there");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Quotas: the admin sets them (governance settings); a creator meets them with the reason.
    // (The plaza world's admin is the seeded demo admin.)
    let ada = dir.join("admin.key");
    metatopia_node::store::write_key(&ada, &metatopia_sim::genesis::demo_key(1, 0)).unwrap();
    let ada = ada.to_str().unwrap();
    ok(&["admin", "--node", h0, "--key", ada, "login", "ada"]);
    let quotas = [
        "settings",
        "--max-objects-per-account",
        "2",
        "--max-source-bytes",
        "1000",
        "--max-script-bytes-per-account",
        "1000",
    ];
    let out = ok(&[&["admin", "--node", h1, "--key", ada][..], &quotas[..]].concat());
    assert!(out.contains("executed at tick"), "{out}");
    let status = ok(&["admin", "--node", h0, "status"]);
    assert!(status.contains("2 objects and 1000 bytes of script an account"), "{status}");
    let rez = |name: &str| ok(&["object", "rez", "--node", h0, "--key", me, "--name", name, "--at", &at]);
    let id_of = |out: &str| out.split("object ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().to_owned();
    let (a, b) = (id_of(&rez("a")), id_of(&rez("b")));
    let err = refused(&["object", "rez", "--node", h0, "--key", me, "--name", "c", "--at", &at]);
    assert!(err.contains("refused at tick") && err.contains("quota of 2 objects"), "{err}");
    std::fs::write(&file, format!("fn on_touch(who) {{ set_text(\"on\"); }}\n//{}\n", "x".repeat(560))).unwrap();
    ok(&["script", "deploy", f, "--object", &a, "--node", h1, "--key", me]);
    let err = refused(&["script", "deploy", f, "--object", &b, "--node", h1, "--key", me]);
    assert!(err.contains("quota of 1000 bytes of script would be exceeded"), "{err}");

    // The terminal client builds too: rez beside the avatar, deploy a file, edit, and see its
    // script's error in the errors pane's channel.
    let lamp_file = dir.join("tui.rhai");
    std::fs::write(&lamp_file, "fn on_touch(who) { throw \"fuse blown\"; }\n").unwrap();
    let key = metatopia_client::keys::read(std::path::Path::new(stranger)).unwrap().unwrap();
    let join: metatopia_client::proto::NodeAddr = cluster.join[0].parse().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async move {
        use metatopia_client::tui::{App, EditField, Intent, perform};
        let mut c = metatopia_client::Client::connect(&join, key).await.unwrap();
        c.login("stranger").await.unwrap();
        let mut app = App::new(c.account());
        let me = app.me.clone();
        assert!(c.run_until(Duration::from_secs(20), |v, _| v.avatar_of(&me).is_some()).await, "my avatar");
        assert!(perform(&mut c, &mut app, Intent::Rez("tui lamp".into())).await);
        let mine = |v: &metatopia_client::View| {
            v.objects.values().find(|o| o.name == "tui lamp" && o.owner == me).map(|o| o.id.clone())
        };
        assert!(c.run_until(Duration::from_secs(20), |v, _| mine(v).is_some()).await, "rezzed beside me");
        let id = mine(c.view()).unwrap();
        assert!(perform(&mut c, &mut app, Intent::Deploy(lamp_file.to_str().unwrap().into())).await);
        assert!(
            c.run_until(Duration::from_secs(20), |v, _| v.objects.get(&id).is_some_and(|o| o.scripted)).await,
            "deployed: {}",
            app.notice
        );
        assert!(perform(&mut c, &mut app, Intent::Edit(EditField::Text, "tui says hi".into())).await);
        assert!(
            c.run_until(Duration::from_secs(20), |v, _| v.objects.get(&id).is_some_and(|o| o.text == "tui says hi"))
                .await,
            "edited"
        );
        assert!(perform(&mut c, &mut app, Intent::Touch(id.clone())).await);
        let err =
            |v: &metatopia_client::View| v.chat.iter().any(|l| l.channel == i32::MAX && l.text.contains("fuse blown"));
        assert!(c.run_until(Duration::from_secs(20), |v, _| err(v)).await, "the error reached its owner");
    });
}
