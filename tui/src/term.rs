//! The terminal: raw mode and the alternate screen while the console runs, restored by an RAII
//! guard and by a panic hook whatever happens; key presses read on their own thread.

use std::io::{self, Stdout};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossterm::event::{self, Event, KeyEvent};
use crossterm::{cursor, execute, terminal};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::sync::mpsc;

use crate::app::App;

/// Whether the terminal is in the console's mode (so restoring twice is harmless).
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// The terminal in the console's mode; dropping it restores the terminal.
pub struct Term {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Term {
    pub fn enter() -> io::Result<Term> {
        install_panic_hook();
        terminal::enable_raw_mode()?;
        ACTIVE.store(true, Ordering::SeqCst);
        let mut stdout = io::stdout();
        if let Err(e) = execute!(stdout, terminal::EnterAlternateScreen, cursor::Hide) {
            restore();
            return Err(e);
        }
        let terminal = match Terminal::new(CrosstermBackend::new(stdout)) {
            Ok(t) => t,
            Err(e) => {
                restore();
                return Err(e);
            }
        };
        Ok(Term { terminal })
    }

    pub fn draw(&mut self, app: &App) -> io::Result<()> {
        self.terminal.draw(|frame| crate::ui::draw(frame, app))?;
        Ok(())
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves raw mode and the alternate screen, once.
fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = terminal::disable_raw_mode();
        let _ = execute!(io::stdout(), terminal::LeaveAlternateScreen, cursor::Show);
    }
}

/// A panic restores the terminal before its message is printed, so the message is readable
/// and the shell usable.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

/// What the terminal reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Key(KeyEvent),
    /// The window changed size: draw again.
    Resize,
}

/// Terminal input, read on a thread of its own (reading blocks). The thread ends when the
/// receiver is dropped.
pub fn keys() -> mpsc::Receiver<io::Result<Input>> {
    let (tx, rx) = mpsc::channel(64);
    std::thread::spawn(move || {
        loop {
            if tx.is_closed() {
                return;
            }
            let input = match event::poll(Duration::from_millis(200)) {
                Ok(false) => continue,
                Ok(true) => match event::read() {
                    Ok(Event::Key(k)) => Ok(Input::Key(k)),
                    Ok(Event::Resize(..)) => Ok(Input::Resize),
                    Ok(_) => continue,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            let failed = input.is_err();
            if tx.blocking_send(input).is_err() || failed {
                return;
            }
        }
    });
    rx
}
