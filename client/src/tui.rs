//! The terminal client: a map around the avatar (objects, avatars, the region's borders), a chat
//! pane with channels (`/1 text` says on channel 1), keys to walk and touch, and the nearest
//! object's script source. The screen is a pure function of [`App`] and the client's [`View`]
//! ([`draw`]), and keys are a pure function to [`Intent`]s ([`App::on_key`]), so both are
//! tested with ratatui's `TestBackend`; [`run`] wires them to a terminal and a [`Client`].

use std::time::{Duration, Instant};

use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use metatopia_sim::event::{ChatRange, Payload};
use metatopia_sim::pipeline::DEBUG_CHANNEL;
use metatopia_sim::state::{BodyKind, Shape};
use metatopia_sim::{Fx, ObjectEdit, ObjectId, Vec2};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use crate::conn::{Client, View, parse_object};
use crate::proto::{ObjectView, ServerMsg};

/// Walking speed, metres per second.
pub const WALK_SPEED: i64 = 4;

/// What a key asks the client to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Intent {
    None,
    Walk(i64, i64),
    Say {
        channel: i32,
        text: String,
    },
    Touch(String),
    ShowScript(String),
    /// `/rez NAME`: a static 1 m box beside the avatar.
    Rez(String),
    /// `/text T`, `/name N`, `/color RRGGBBAA`: edit the nearest object of one's own.
    Edit(EditField, String),
    /// `/deploy FILE`: the script in FILE on the nearest object of one's own (a fork's header
    /// records what it derives from).
    Deploy(String),
    /// `/derez`: take the nearest object of one's own out of the world.
    Derez,
    Quit,
}

/// What `/text`, `/name` and `/color` change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EditField {
    Text,
    Name,
    Color,
}

/// The terminal client's own state (the world is in the client's [`View`]).
#[derive(Debug, Clone)]
pub struct App {
    /// This client's account id.
    pub me: String,
    /// The chat line being typed (`Some` while typing).
    pub input: Option<String>,
    /// The object whose script is shown.
    pub script: Option<ObjectView>,
    pub notice: String,
    /// Metres per map column (rows are two metres each).
    pub scale: i64,
    pub velocity: (i64, i64),
    pub node: String,
    /// The own avatar's walk, predicted (see [`App::drawn_mm`]).
    pub walk: Option<Walk>,
}

/// A walk of the own avatar as predicted from the key press: from where it was drawn then, at
/// the walk's velocity (metres a second), until the stop key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    pub from_mm: [i64; 2],
    pub velocity: (i64, i64),
    pub since: Instant,
    pub until: Option<Instant>,
}

/// How long after a stop the prediction gives way to the committed position once the sim has
/// the avatar at rest (and at the latest).
const SETTLE: Duration = Duration::from_millis(300);
const SETTLE_AT_LATEST: Duration = Duration::from_secs(3);

impl App {
    pub fn new(me: &str) -> App {
        App {
            me: me.to_string(),
            input: None,
            script: None,
            notice: String::new(),
            scale: 1,
            velocity: (0, 0),
            node: String::new(),
            walk: None,
        }
    }

    /// Start (or, with a zero velocity, stop) predicting a walk of the own avatar at `now`.
    pub fn start_walk(&mut self, velocity: (i64, i64), view: &View, now: Instant) {
        if velocity == (0, 0) {
            if let Some(w) = self.walk.as_mut().filter(|w| w.until.is_none()) {
                w.until = Some(now);
            }
            return;
        }
        // A new walk starts where the avatar is drawn now (the last one's end, if it was one).
        if let Some(from_mm) = self.drawn_mm(view, now) {
            self.walk = Some(Walk { from_mm, velocity, since: now, until: None });
        }
    }

    /// Where to draw the own avatar at `now` (millimetres): while a walk is predicted, where it
    /// will be once its input is executed (a few network round trips after the key press), so
    /// the map answers the key at once; once it stopped and the sim has the avatar at rest (or
    /// 3 s after the stop), where the sim put it.
    pub fn drawn_mm(&self, view: &View, now: Instant) -> Option<[i64; 2]> {
        let me = view.avatar_of(&self.me)?;
        let committed = view.position_mm(&me.id)?;
        let Some(w) = self.walk else { return Some(committed) };
        if let Some(until) = w.until {
            let at_rest = view.velocity_mm(&me.id) == Some([0, 0]);
            let since_stop = now.saturating_duration_since(until);
            if (at_rest && since_stop >= SETTLE) || since_stop >= SETTLE_AT_LATEST {
                return Some(committed);
            }
        }
        let end = w.until.map_or(now, |u| u.min(now));
        let ms = end.saturating_duration_since(w.since).as_millis() as i64;
        Some([w.from_mm[0] + w.velocity.0 * ms, w.from_mm[1] + w.velocity.1 * ms])
    }

    fn my_position(&self, view: &View) -> Option<[i64; 2]> {
        view.avatar_of(&self.me).and_then(|a| view.metres_of(&a.id))
    }

    /// What a key press asks for.
    pub fn on_key(&mut self, key: KeyEvent, view: &View) -> Intent {
        if key.kind == KeyEventKind::Release {
            return Intent::None;
        }
        if let Some(input) = self.input.as_mut() {
            match key.code {
                KeyCode::Esc => self.input = None,
                KeyCode::Backspace => {
                    input.pop();
                }
                KeyCode::Enter => {
                    let line = self.input.take().unwrap_or_default();
                    return chat_intent(&line);
                }
                KeyCode::Char(c) => input.push(c),
                _ => {}
            }
            return Intent::None;
        }
        if self.script.is_some() && matches!(key.code, KeyCode::Esc | KeyCode::Char('v') | KeyCode::Char('q')) {
            self.script = None;
            return Intent::None;
        }
        let walk = |v: (i64, i64), app: &mut App| {
            app.velocity = v;
            app.start_walk(v, view, Instant::now());
            Intent::Walk(v.0, v.1)
        };
        match key.code {
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => Intent::Quit,
            KeyCode::Char('q') => Intent::Quit,
            KeyCode::Up | KeyCode::Char('w') => walk((0, WALK_SPEED), self),
            KeyCode::Down | KeyCode::Char('s') => walk((0, -WALK_SPEED), self),
            KeyCode::Left | KeyCode::Char('a') => walk((-WALK_SPEED, 0), self),
            KeyCode::Right | KeyCode::Char('d') => walk((WALK_SPEED, 0), self),
            KeyCode::Char(' ') => walk((0, 0), self),
            KeyCode::Enter | KeyCode::Char('/') => {
                self.input = Some(if key.code == KeyCode::Char('/') { "/".into() } else { String::new() });
                Intent::None
            }
            KeyCode::Char('+') => {
                self.scale = (self.scale - 1).max(1);
                Intent::None
            }
            KeyCode::Char('-') => {
                self.scale = (self.scale + 1).min(16);
                Intent::None
            }
            KeyCode::Char('t') | KeyCode::Char('v') => {
                let Some(at) = self.my_position(view) else {
                    self.notice = "no avatar yet".into();
                    return Intent::None;
                };
                match view.nearest_thing(at) {
                    Some(o) if key.code == KeyCode::Char('t') => Intent::Touch(o.id.clone()),
                    Some(o) => Intent::ShowScript(o.id.clone()),
                    None => {
                        self.notice = "nothing near".into();
                        Intent::None
                    }
                }
            }
            _ => Intent::None,
        }
    }
}

/// `/N text` says on channel N; anything else on channel 0.
pub fn chat_intent(line: &str) -> Intent {
    let line = line.trim();
    if line.is_empty() {
        return Intent::None;
    }
    if let Some(rest) = line.strip_prefix('/') {
        let (ch, text) = rest.split_once(' ').unwrap_or((rest, ""));
        if let Ok(channel) = ch.parse::<i32>() {
            return Intent::Say { channel, text: text.trim().to_string() };
        }
        let text = text.trim().to_string();
        match (ch, text.is_empty()) {
            ("rez", false) => return Intent::Rez(text),
            ("text", _) => return Intent::Edit(EditField::Text, text),
            ("name", false) => return Intent::Edit(EditField::Name, text),
            ("color", false) => return Intent::Edit(EditField::Color, text),
            ("deploy", false) => return Intent::Deploy(text),
            ("derez", true) => return Intent::Derez,
            _ => {}
        }
    }
    Intent::Say { channel: 0, text: line.to_string() }
}

/// The glyph of an object on the map.
fn glyph(o: &ObjectView, me: &str) -> (char, Style) {
    if o.avatar && o.owner == me {
        return ('@', Style::default().fg(Color::Yellow).add_modifier(Modifier::BOLD));
    }
    if o.avatar {
        let c = o.name.chars().next().map_or('A', |c| c.to_ascii_uppercase());
        return (c, Style::default().fg(Color::Cyan).add_modifier(Modifier::BOLD));
    }
    let c = if o.scripted {
        '*'
    } else if o.shape.starts_with("box") {
        '#'
    } else {
        'o'
    };
    (c, Style::default().fg(Color::Green))
}

/// The map: `area` columns and rows around `center` (whole metres), y up.
fn map_lines(app: &App, view: &View, area: Rect, center: [i64; 2], me_at: Option<[i64; 2]>) -> Vec<Line<'static>> {
    let (w, h) = (i64::from(area.width.max(1)), i64::from(area.height.max(1)));
    let (sx, sy) = (app.scale, app.scale * 2);
    let left = center[0] - (w / 2) * sx;
    let top = center[1] + (h / 2) * sy;
    let mut cells: Vec<Vec<(char, Style)>> =
        vec![vec![('.', Style::default().fg(Color::DarkGray)); w as usize]; h as usize];
    // The region's borders.
    if let Some(st) = &view.status {
        let (x0, y0, side) = (st.region_origin[0], st.region_origin[1], st.region_size);
        for (r, row) in cells.iter_mut().enumerate() {
            let y = top - r as i64 * sy;
            for (c, cell) in row.iter_mut().enumerate() {
                let x = left + c as i64 * sx;
                let inside = (x0..x0 + side).contains(&x) && (y0..y0 + side).contains(&y);
                let edge_x = x <= x0 && x + sx > x0 || x < x0 + side && x + sx >= x0 + side;
                let edge_y = y <= y0 && y + sy > y0 || y < y0 + side && y + sy >= y0 + side;
                if !inside && !edge_x && !edge_y {
                    *cell = (' ', Style::default());
                } else if edge_x && (y0..=y0 + side).contains(&y) {
                    *cell = ('|', Style::default().fg(Color::Magenta));
                } else if edge_y && (x0..=x0 + side).contains(&x) {
                    *cell = ('-', Style::default().fg(Color::Magenta));
                }
            }
        }
    }
    // Objects, then avatars on top, then me.
    let mut objects: Vec<&ObjectView> = view.objects.values().collect();
    objects.sort_by_key(|o| (o.avatar, o.owner == app.me));
    for o in objects {
        let p = match me_at {
            Some(at) if o.avatar && o.owner == app.me => at,
            _ => view.metres_of(&o.id).unwrap_or_else(|| o.metres()),
        };
        let (c, r) = ((p[0] - left).div_euclid(sx), (top - p[1]).div_euclid(sy));
        if (0..w).contains(&c) && (0..h).contains(&r) {
            cells[r as usize][c as usize] = glyph(o, &app.me);
        }
    }
    cells
        .into_iter()
        .map(|row| Line::from(row.into_iter().map(|(c, s)| Span::styled(c.to_string(), s)).collect::<Vec<_>>()))
        .collect()
}

/// Draw the whole screen.
pub fn draw(f: &mut Frame, app: &App, view: &View) {
    let [top, status, help] =
        Layout::vertical([Constraint::Min(5), Constraint::Length(1), Constraint::Length(1)]).areas(f.area());
    let [map_area, chat_area] = Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(top);
    let me = view.avatar_of(&app.me);
    // The own avatar where it is predicted to be (the map follows it at once on a key press).
    let me_at = app.drawn_mm(view, Instant::now()).map(|p| [p[0].div_euclid(1000), p[1].div_euclid(1000)]);
    let center = me_at.unwrap_or_else(|| {
        view.status
            .as_ref()
            .map_or([0, 0], |s| [s.region_origin[0] + s.region_size / 2, s.region_origin[1] + s.region_size / 2])
    });
    let title = match me {
        Some(a) => {
            let p = view.position_of(&a.id).unwrap_or_else(|| a.position.clone());
            format!(" {} at {}, {} ", a.name, p[0], p[1])
        }
        None => " map (not logged in) ".to_string(),
    };
    let block = Block::bordered().title(title);
    let inner = block.inner(map_area);
    f.render_widget(Paragraph::new(map_lines(app, view, inner, center, me_at)).block(block), map_area);

    // Chat: the newest lines that fit, then the input line; below it, one's scripts' errors
    // (the private debug channel).
    let [chat_area, errors_area] = Layout::vertical([Constraint::Min(4), Constraint::Length(5)]).areas(chat_area);
    let debug = |c: &&crate::proto::ChatView| c.channel == DEBUG_CHANNEL;
    let errors: Vec<Line> = view
        .chat
        .iter()
        .filter(debug)
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .map(|c| {
            Line::from(vec![
                Span::styled(format!("{}: ", c.name), Style::default().fg(Color::Red)),
                Span::raw(c.text.clone()),
            ])
        })
        .collect();
    f.render_widget(
        Paragraph::new(errors).wrap(Wrap { trim: true }).block(Block::bordered().title(" your scripts' errors ")),
        errors_area,
    );
    let block = Block::bordered().title(" chat (enter: talk, /1 text: channel 1) ");
    let inner = block.inner(chat_area);
    let room = inner.height.saturating_sub(1) as usize;
    let mut lines: Vec<Line> = view
        .chat
        .iter()
        .filter(|c| !debug(c))
        .rev()
        .take(room)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .map(|c| {
            let ch = if c.channel == 0 { String::new() } else { format!("[{}] ", c.channel) };
            Line::from(vec![
                Span::styled(format!("{ch}{}: ", c.name), Style::default().fg(Color::Cyan)),
                Span::raw(c.text.clone()),
            ])
        })
        .collect();
    while lines.len() < room {
        lines.insert(0, Line::raw(""));
    }
    lines.push(match &app.input {
        Some(t) => Line::styled(format!("> {t}_"), Style::default().fg(Color::Yellow)),
        None => Line::styled("> (enter to talk)", Style::default().fg(Color::DarkGray)),
    });
    f.render_widget(Paragraph::new(lines).block(block), chat_area);

    let st = view.status.as_ref();
    let status_line = format!(
        "tick {} | sim {} | node {} | dilation {:.2} | {} objects in view{}",
        view.tick,
        st.map_or(0, |s| s.sim),
        if app.node.is_empty() { "-" } else { &app.node },
        st.map_or(0.0, |s| s.dilation),
        view.objects.len(),
        if app.notice.is_empty() { String::new() } else { format!(" | {}", app.notice) }
    );
    f.render_widget(Paragraph::new(status_line).style(Style::default().add_modifier(Modifier::REVERSED)), status);
    f.render_widget(
        Paragraph::new(
            "arrows/wasd walk  space stop  enter talk  t touch  v script  /rez N /text T /deploy F /derez build  +/- zoom  q quit",
        ),
        help,
    );

    if let Some(o) = &app.script {
        let area = centered(f.area(), 80, 80);
        let mut text =
            vec![Line::styled(format!("{} ({})", o.name, o.id), Style::default().add_modifier(Modifier::BOLD))];
        match &o.script {
            Some(s) => {
                text.push(Line::raw(format!("licence {}  author {}…", s.licence, &s.author[..s.author.len().min(12)])));
                text.push(Line::raw(format!(
                    "script {}…  derived from {}",
                    &s.id[..s.id.len().min(12)],
                    s.derived_from.as_deref().map_or("nothing", |d| &d[..d.len().min(12)])
                )));
                text.push(Line::raw(""));
                text.extend(s.source.lines().map(|l| Line::raw(l.to_string())));
            }
            None => text.push(Line::raw("no script")),
        }
        f.render_widget(Clear, area);
        f.render_widget(
            Paragraph::new(text)
                .wrap(Wrap { trim: false })
                .block(Block::bordered().title(" script source (esc closes) ")),
            area,
        );
    }
}

fn centered(r: Rect, pw: u16, ph: u16) -> Rect {
    let w = r.width * pw / 100;
    let h = r.height * ph / 100;
    Rect { x: r.x + (r.width - w) / 2, y: r.y + (r.height - h) / 2, width: w, height: h }
}

/// Carry out an intent with the client (without waiting for outcomes: refusals arrive as
/// messages and show as notices).
pub async fn perform(client: &mut Client, app: &mut App, intent: Intent) -> bool {
    let result = match intent {
        Intent::None => return true,
        Intent::Quit => {
            // The avatar leaves now; a client killed instead leaves it for the sim's grace period.
            if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(3), client.logout()).await {
                tracing::debug!("logging out: {e}");
            }
            return false;
        }
        Intent::Walk(vx, vy) => match client.view().avatar_of(client.account()).and_then(|a| parse_object(&a.id)) {
            Some(object) => {
                let velocity = Vec2::new(Fx::from_int(vx), Fx::from_int(vy));
                client.submit(Payload::Move { object, velocity }).await.map(|_| ())
            }
            None => {
                app.notice = "no avatar in view yet".into();
                Ok(())
            }
        },
        Intent::Say { channel, text } => {
            client.submit(Payload::Chat { channel, range: ChatRange::Say, text }).await.map(|_| ())
        }
        Intent::Touch(id) => match parse_object(&id) {
            Some(object) => {
                app.notice = format!("touched {id}");
                client.submit(Payload::Touch { object }).await.map(|_| ())
            }
            None => Ok(()),
        },
        Intent::ShowScript(id) => {
            match client.object(&id).await {
                Ok(o) => app.script = o,
                Err(e) => app.notice = format!("{e:#}"),
            }
            Ok(())
        }
        Intent::Rez(name) => match app.my_position(client.view()) {
            Some([x, y]) => {
                app.notice = format!("rezzing {name:?}");
                let payload = Payload::Rez {
                    name,
                    shape: Shape::Box { half_width: Fx::HALF, half_height: Fx::HALF },
                    position: Vec2::from_ints(x + 2, y),
                    color: 0x808080ff,
                    text: String::new(),
                    body: BodyKind::Static,
                };
                client.submit(payload).await.map(|_| ())
            }
            None => {
                app.notice = "no avatar in view yet".into();
                Ok(())
            }
        },
        intent @ (Intent::Edit(..) | Intent::Deploy(_) | Intent::Derez) => {
            let Some(object) = mine_nearest(app, client.view()) else {
                app.notice = "none of your objects is in view".into();
                return true;
            };
            match build_payload(intent, object) {
                Ok(payload) => client.submit(payload).await.map(|_| ()),
                Err(why) => {
                    app.notice = why;
                    Ok(())
                }
            }
        }
    };
    if let Err(e) = result {
        app.notice = e.to_string();
    }
    true
}

/// The nearest object (not an avatar) this client's account owns.
fn mine_nearest(app: &App, view: &View) -> Option<ObjectId> {
    let at = app.my_position(view)?;
    view.objects
        .values()
        .filter(|o| !o.avatar && o.owner == app.me)
        .min_by_key(|o| {
            let p = view.metres_of(&o.id).unwrap_or_else(|| o.metres());
            ((p[0] - at[0]).pow(2) + (p[1] - at[1]).pow(2), o.id.clone())
        })
        .and_then(|o| parse_object(&o.id))
}

/// The signed event of a build intent on `object`, or why there is none.
pub fn build_payload(intent: Intent, object: ObjectId) -> Result<Payload, String> {
    Ok(match intent {
        Intent::Edit(field, value) => {
            let mut edit = ObjectEdit::default();
            match field {
                EditField::Text => edit.text = Some(value),
                EditField::Name => edit.name = Some(value),
                EditField::Color => {
                    let hex = value.trim_start_matches('#');
                    let c = u32::from_str_radix(hex, 16).ok().filter(|_| hex.len() == 8);
                    edit.color = Some(c.ok_or_else(|| format!("/color takes RRGGBBAA hex, not {value:?}"))?);
                }
            }
            Payload::Edit { object, edit }
        }
        Intent::Deploy(file) => {
            let source = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
            let derived_from = crate::fork::derived_from(&source)?;
            Payload::DeployScript { object, source, licence: "AGPL-3.0-or-later".into(), derived_from }
        }
        Intent::Derez => Payload::Derez { object },
        other => return Err(format!("{other:?} is not a build act")),
    })
}

/// Why the terminal client stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum TuiError {
    #[error("drawing: {0}")]
    Terminal(#[from] std::io::Error),
    #[error("the node closed the session: {0}")]
    Closed(String),
    #[error("no node of the sim answers any more")]
    Gone,
}

/// Run the terminal client until `q` (restores the terminal on the way out, also on errors).
pub async fn run(mut client: Client) -> Result<(), TuiError> {
    let mut terminal = ratatui::init();
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<KeyEvent>(64);
    std::thread::spawn(move || {
        loop {
            match crossterm::event::poll(Duration::from_millis(200)) {
                Ok(true) => {
                    if let Ok(Event::Key(k)) = crossterm::event::read()
                        && keys_tx.blocking_send(k).is_err()
                    {
                        return;
                    }
                }
                Ok(false) => {
                    if keys_tx.is_closed() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    let mut app = App::new(client.account());
    let result: Result<(), TuiError> = async {
        let mut redraw = tokio::time::interval(Duration::from_millis(100));
        loop {
            app.node = client.node().map(|n| n.addr.clone()).unwrap_or_default();
            terminal.draw(|f| draw(f, &app, client.view()))?;
            tokio::select! {
                k = keys.recv() => {
                    let Some(k) = k else { return Ok(()) };
                    let intent = app.on_key(k, client.view());
                    if !perform(&mut client, &mut app, intent).await {
                        return Ok(());
                    }
                }
                m = client.next() => match m {
                    None => match client.closed() {
                        Some(why) => return Err(TuiError::Closed(why.to_owned())),
                        None => return Err(TuiError::Gone),
                    },
                    Some(ServerMsg::Outcome { outcome: crate::proto::Outcome::Refused { reason, .. }, .. }) => {
                        app.notice = format!("refused: {reason}");
                    }
                    Some(ServerMsg::Error { message, .. }) => app.notice = message,
                    Some(_) => {}
                },
                _ = redraw.tick() => {}
            }
        }
    }
    .await;
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{ChatView, ScriptView, Status};
    use metatopia_sim::Tick;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn object(id: &str, name: &str, owner: &str, avatar: bool, x: i64, y: i64) -> ObjectView {
        ObjectView {
            id: id.into(),
            name: name.into(),
            owner: owner.into(),
            avatar,
            position: [x.to_string(), y.to_string()],
            velocity: ["0".into(), "0".into()],
            shape: if avatar { "circle 0.4".into() } else { "box 1 1".into() },
            color: "ffffffff".into(),
            text: String::new(),
            script: None,
            scripted: name == "door",
            body: "static".into(),
            surface: String::new(),
        }
    }

    fn world(me: &str) -> View {
        let mut view = View::default();
        let status = Status {
            sim: 3,
            tick: Tick(41),
            region_origin: [0, 0],
            region_size: 256,
            dilation: 1.0,
            ..Status::default()
        };
        view.apply(&ServerMsg::Status(Box::new(status)));
        view.apply(&ServerMsg::Tick {
            tick: Tick(42),
            enter: vec![
                object("0v0", "ada", me, true, 10, 20),
                object("1v0", "bob", "other", true, 15, 20),
                object("2v0", "door", "x", false, 12, 24),
                object("3v0", "crate", "x", false, 4, 12),
            ],
            update: vec![],
            leave: vec![],
        });
        view.apply(&ServerMsg::Chat(ChatView {
            tick: Tick(40),
            name: "bob".into(),
            channel: 0,
            text: "hello ada".into(),
            position: [15, 20],
            range_m: 20,
            to: None,
        }));
        view.apply(&ServerMsg::Chat(ChatView {
            tick: Tick(41),
            name: "door".into(),
            channel: 7,
            text: "creak".into(),
            position: [12, 24],
            range_m: 20,
            to: None,
        }));
        view
    }

    fn screen(app: &App, view: &View) -> Vec<String> {
        let mut t = Terminal::new(TestBackend::new(80, 20)).unwrap();
        t.draw(|f| draw(f, app, view)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>())
            .collect()
    }

    #[test]
    fn the_map_shows_me_others_things_and_the_region_border_with_chat_and_status() {
        let me = "aa".repeat(32);
        let app = App::new(&me);
        let view = world(&me);
        let rows = screen(&app, &view);
        let text = rows.join("\n");
        assert!(text.contains("ada at 10, 20"), "{text}");
        assert!(text.contains("bob: hello ada"), "{text}");
        assert!(text.contains("[7] door: creak"), "{text}");
        assert!(text.contains("tick 42 | sim 3"), "{text}");
        // Map geometry: the map's inner area is 46 x 15 (60% of 80 minus borders); I am at its
        // center; bob 5 m east on my row; the door 2 m east and 4 m (two rows) north; the
        // region's west border 10 m west of me; the crate 6 m west, 8 m (four rows) south.
        let me_row = rows.iter().position(|r| r.contains('@')).unwrap();
        let me_col = rows[me_row].chars().position(|c| c == '@').unwrap();
        assert_eq!(rows[me_row].chars().nth(me_col + 5), Some('B'), "{text}");
        assert_eq!(rows[me_row - 2].chars().nth(me_col + 2), Some('*'), "{text}");
        assert_eq!(rows[me_row + 4].chars().nth(me_col - 6), Some('#'), "{text}");
        assert_eq!(rows[me_row].chars().nth(me_col - 10), Some('|'), "{text}");
        assert_eq!(rows[me_row].chars().nth(me_col - 11), Some(' '), "outside the region is blank: {text}");
    }

    #[test]
    fn keys_walk_talk_touch_and_show_scripts() {
        let me = "aa".repeat(32);
        let mut app = App::new(&me);
        let mut view = world(&me);
        let key = |c: KeyCode| KeyEvent::new(c, KeyModifiers::NONE);
        assert_eq!(app.on_key(key(KeyCode::Right), &view), Intent::Walk(WALK_SPEED, 0));
        assert_eq!(app.on_key(key(KeyCode::Char('w')), &view), Intent::Walk(0, WALK_SPEED));
        assert_eq!(app.on_key(key(KeyCode::Char(' ')), &view), Intent::Walk(0, 0));
        // The nearest thing (not an avatar) is the door, 4.5 m away.
        assert_eq!(app.on_key(key(KeyCode::Char('t')), &view), Intent::Touch("2v0".into()));
        assert_eq!(app.on_key(key(KeyCode::Char('v')), &view), Intent::ShowScript("2v0".into()));
        // Typing: keys go to the line until Enter; "/1 open" says on channel 1.
        assert_eq!(app.on_key(key(KeyCode::Char('/')), &view), Intent::None);
        for c in "1 open sesame".chars() {
            assert_eq!(app.on_key(key(KeyCode::Char(c)), &view), Intent::None);
        }
        assert!(screen(&app, &view).join("\n").contains("> /1 open sesame_"));
        assert_eq!(app.on_key(key(KeyCode::Enter), &view), Intent::Say { channel: 1, text: "open sesame".into() });
        assert_eq!(chat_intent("hi there"), Intent::Say { channel: 0, text: "hi there".into() });
        assert_eq!(chat_intent("/x y"), Intent::Say { channel: 0, text: "/x y".into() });
        assert_eq!(chat_intent("   "), Intent::None);
        // The script pane shows source, licence and provenance; Esc closes it.
        let mut door = view.objects["2v0"].clone();
        door.script = Some(ScriptView {
            source: "fn on_touch(who) {\n    set_text(\"open\");\n}".into(),
            licence: "AGPL-3.0-or-later".into(),
            author: "cc".repeat(32),
            derived_from: None,
            id: "dd".repeat(32),
        });
        app.script = Some(door);
        let text = screen(&app, &view).join("\n");
        assert!(text.contains("licence AGPL-3.0-or-later"), "{text}");
        assert!(text.contains("set_text(\"open\");"), "{text}");
        assert!(text.contains("derived from nothing"), "{text}");
        assert_eq!(app.on_key(key(KeyCode::Esc), &view), Intent::None);
        assert!(app.script.is_none());
        assert_eq!(app.on_key(key(KeyCode::Char('q')), &view), Intent::Quit);
        // Without an avatar in view there is nothing to touch.
        view.objects.remove("0v0");
        assert_eq!(app.on_key(key(KeyCode::Char('t')), &view), Intent::None);
        assert_eq!(app.notice, "no avatar yet");
    }

    #[test]
    fn build_commands_on_the_chat_line_and_the_errors_pane() {
        assert_eq!(chat_intent("/rez lamp post"), Intent::Rez("lamp post".into()));
        assert_eq!(chat_intent("/text on air"), Intent::Edit(EditField::Text, "on air".into()));
        assert_eq!(chat_intent("/color ffcc00ff"), Intent::Edit(EditField::Color, "ffcc00ff".into()));
        assert_eq!(chat_intent("/deploy lamp.rhai"), Intent::Deploy("lamp.rhai".into()));
        assert_eq!(chat_intent("/derez"), Intent::Derez);
        assert_eq!(chat_intent("/rez"), Intent::Say { channel: 0, text: "/rez".into() }, "a name is needed");
        let object = ObjectId::new(3, 0);
        let Ok(Payload::Edit { edit, .. }) = build_payload(Intent::Edit(EditField::Color, "#ffcc00ff".into()), object)
        else {
            panic!("an edit")
        };
        assert_eq!(edit.color, Some(0xffcc00ff));
        let bad = build_payload(Intent::Edit(EditField::Color, "red".into()), object).unwrap_err();
        assert!(bad.contains("RRGGBBAA"), "{bad}");
        let missing = build_payload(Intent::Deploy("/nonexistent/lamp.rhai".into()), object).unwrap_err();
        assert!(missing.contains("/nonexistent/lamp.rhai"), "{missing}");
        // A script's error (the owner's private channel) shows in its own pane, not in the chat.
        let me = "aa".repeat(32);
        let mut view = world(&me);
        view.apply(&ServerMsg::Chat(ChatView {
            tick: Tick(42),
            name: "lamp".into(),
            channel: DEBUG_CHANNEL,
            text: "runtime error: boom (line 1, position 20)".into(),
            position: [12, 24],
            range_m: 0,
            to: Some(me.clone()),
        }));
        let rows = screen(&App::new(&me), &view);
        let at = rows.iter().position(|r| r.contains("your scripts' errors")).expect("the errors pane");
        assert!(rows[at + 1..].iter().any(|r| r.contains("lamp: runtime error: boom")), "{}", rows.join("\n"));
        assert!(rows[..at].iter().all(|r| !r.contains("boom")), "not in the chat pane");
    }

    /// The own avatar answers a walk key at once on the map (before the walk is agreed and
    /// executed, a few round trips later), stops where the stop key left it, and settles on the
    /// committed position once the sim has it at rest.
    #[test]
    fn the_own_avatar_is_predicted_from_the_key_press_and_settles_where_the_sim_put_it() {
        let me = "aa".repeat(32);
        let mut view = world(&me);
        let mut app = App::new(&me);
        let t0 = Instant::now();
        assert_eq!(app.drawn_mm(&view, t0), Some([10_000, 20_000]), "no walk: where the sim has it");
        app.start_walk((WALK_SPEED, 0), &view, t0);
        // Half a second later, nothing executed yet: drawn 2 m on (4 m/s).
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(app.drawn_mm(&view, t1), Some([12_000, 20_000]));
        // The map follows the prediction: `@` is two columns right of where the sim has it.
        let rows = screen(&app, &view);
        assert!(rows.iter().any(|r| r.contains('@')), "{}", rows.join("\n"));
        // Stopped at 0.5 s: it stays there (the sim has not caught up).
        app.start_walk((0, 0), &view, t1);
        let t2 = t1 + Duration::from_millis(200);
        assert_eq!(app.drawn_mm(&view, t2), Some([12_000, 20_000]));
        // The sim executed the walk and has the avatar at rest, a little further: after the
        // settling time it is drawn where the sim put it.
        view.apply(&ServerMsg::Tick {
            tick: Tick(60),
            enter: vec![],
            update: vec![crate::proto::ObjectUpdate {
                id: "0v0".into(),
                at_mm: Some([12_100, 20_000]),
                vel_mm: Some([0, 0]),
                ..Default::default()
            }],
            leave: vec![],
        });
        assert_eq!(app.drawn_mm(&view, t2), Some([12_000, 20_000]), "within the settling time");
        assert_eq!(app.drawn_mm(&view, t1 + SETTLE), Some([12_100, 20_000]));
        // A new walk starts where the avatar is drawn.
        app.start_walk((0, WALK_SPEED), &view, t1 + SETTLE);
        assert_eq!(app.drawn_mm(&view, t1 + SETTLE + Duration::from_millis(250)), Some([12_100, 21_000]));
    }
}
