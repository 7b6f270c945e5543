//! The `schedule.active` windows compiled: a time zone and the daily windows in minutes, checked
//! once so the gate (`schedule::gate`) only does arithmetic. Quiet hours are the time outside
//! them.

use jiff::civil::Weekday;
use jiff::tz::TimeZone;

use super::error::Diagnostic;
use super::schema::{ActiveWindows, Window};

/// Day names of `days:` in weekday order.
pub const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Minutes in a day; `to: 24:00` is this.
pub const DAY_MINUTES: u32 = 24 * 60;

/// The compiled windows.
#[derive(Debug, Clone)]
pub struct WindowSet {
    pub time_zone: TimeZone,
    /// As written, for logs and `/api/v1/status`.
    pub time_zone_name: String,
    pub windows: Vec<DailyWindow>,
}

/// One window: it starts on each day of `days` at `from` minutes after midnight and ends `to`
/// minutes after midnight, on the next day when `to` is not after `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DailyWindow {
    /// Indexed Monday first.
    pub days: [bool; 7],
    pub from: u32,
    pub to: u32,
}

impl DailyWindow {
    pub fn starts_on(&self, day: Weekday) -> bool {
        self.days[day.to_monday_zero_offset() as usize]
    }

    /// Minutes from the start to the end (crossing midnight when `to` <= `from`).
    pub fn length_minutes(&self) -> u32 {
        if self.to > self.from {
            self.to - self.from
        } else {
            DAY_MINUTES - self.from + self.to
        }
    }
}

/// `HH:MM` as minutes after midnight, `24:00` included.
fn minutes(text: &str) -> Option<u32> {
    let (h, m) = text.trim().split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    match (h, m) {
        (24, 0) => Some(DAY_MINUTES),
        (0..=23, 0..=59) => Some(h * 60 + m),
        _ => None,
    }
}

fn compile_window(w: &Window, at: &str, diags: &mut Vec<Diagnostic>) -> Option<DailyWindow> {
    let mut days = [w.days.is_empty(); 7];
    let mut ok = true;
    for d in &w.days {
        match DAY_NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(d.trim()))
        {
            Some(i) => days[i] = true,
            None => {
                ok = false;
                diags.push(
                    Diagnostic::new(d.pos, format!("`{at}.days`: `{}` is not a day", **d))
                        .hint(format!("write days as {}", DAY_NAMES.join(", "))),
                );
            }
        }
    }
    let mut time = |v: &super::At<String>, key: &str| {
        let m = minutes(v);
        if m.is_none() {
            ok = false;
            diags.push(
                Diagnostic::new(v.pos, format!("`{at}.{key}` `{}` is not a time", **v))
                    .hint("write 24-hour `HH:MM`, e.g. `22:00`; `24:00` is the end of the day"),
            );
        }
        m
    };
    let from = time(&w.from, "from");
    let to = time(&w.to, "to");
    let (from, to) = (from?, to?);
    if from == DAY_MINUTES {
        diags.push(
            Diagnostic::new(w.from.pos, format!("`{at}.from` cannot be 24:00"))
                .hint("a window starts at 00:00 to 23:59"),
        );
        return None;
    }
    ok.then_some(DailyWindow { days, from, to })
}

impl ActiveWindows {
    /// The windows checked and compiled; every problem, with its position, otherwise.
    pub fn compile(&self) -> Result<WindowSet, Vec<Diagnostic>> {
        let mut diags = Vec::new();
        let time_zone = match TimeZone::get(self.time_zone.trim()) {
            Ok(tz) => Some(tz),
            Err(_) => {
                diags.push(Diagnostic::new(
                    self.time_zone.pos,
                    format!("`schedule.active.time_zone` `{}` is not a known time zone", *self.time_zone),
                ).hint("write an IANA name such as `UTC`, `Europe/Berlin` or `America/Los_Angeles`"));
                None
            }
        };
        if self.windows.is_empty() {
            diags.push(Diagnostic::new(None, "`schedule.active.windows` is empty: no traffic would ever be sent").hint("add a window such as `{ days: [mon, tue, wed, thu, fri], from: \"20:00\", to: \"06:00\" }`, or remove `schedule.active`"));
        }
        let windows: Vec<DailyWindow> = self
            .windows
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                compile_window(w, &format!("schedule.active.windows[{i}]"), &mut diags)
            })
            .collect();
        match time_zone {
            Some(time_zone) if diags.is_empty() => Ok(WindowSet {
                time_zone,
                time_zone_name: self.time_zone.trim().to_owned(),
                windows,
            }),
            _ => Err(diags),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::At;

    fn window(days: &[&str], from: &str, to: &str) -> Window {
        Window {
            days: days.iter().map(|d| At::dflt((*d).to_owned())).collect(),
            from: At::dflt(from.to_owned()),
            to: At::dflt(to.to_owned()),
        }
    }

    #[test]
    fn times_days_and_zones_are_checked() {
        assert_eq!(minutes("00:00"), Some(0));
        assert_eq!(minutes("22:30"), Some(1350));
        assert_eq!(minutes("24:00"), Some(DAY_MINUTES));
        for bad in ["24:01", "7:00", "12:60", "noon", "12-00"] {
            assert_eq!(minutes(bad), None, "{bad}");
        }
        let good = ActiveWindows {
            time_zone: At::dflt("Europe/Berlin".into()),
            windows: vec![
                window(&["mon", "Fri"], "22:00", "06:00"),
                window(&[], "00:00", "24:00"),
            ],
        };
        let set = good.compile().unwrap();
        assert_eq!(
            set.windows[0].days,
            [true, false, false, false, true, false, false]
        );
        assert_eq!(set.windows[0].length_minutes(), 8 * 60);
        assert_eq!(set.windows[1].days, [true; 7]);
        assert_eq!(set.windows[1].length_minutes(), DAY_MINUTES);
        let bad = ActiveWindows {
            time_zone: At::dflt("Mars/Olympus".into()),
            windows: vec![window(&["funday"], "25:00", "06:00")],
        };
        let errors = bad.compile().unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
    }
}
