//! Levers the harness applies itself, with no engine support: `harness run
//! --lever ID=ARM` sets them in the harness, records them in the `levers` fragment
//! like any lever (so `harness rank` pairs and ranks them), and never passes them to
//! the engine; `harness campaign` accepts their arms without `engine levers --json`.

/// The observer lever: `on` samples and journals every column, `off` only what
/// the watchdog needs (`harness run --observer`). Its cost to the engine is the
/// instrument's overhead, judged like any lever's effect.
pub const OBSERVER: &str = "observer";

/// Every harness-applied lever and its arms.
pub const LEVERS: &[(&str, &[&str])] = &[(OBSERVER, &["off", "on"])];

/// The arms of the harness-applied lever `id`, or None when the engine applies it.
pub fn arms(id: &str) -> Option<&'static [&'static str]> {
    LEVERS.iter().find(|(l, _)| *l == id).map(|(_, a)| *a)
}

/// Whether `id` is applied by the harness (and so never passed to the engine).
pub fn applies(id: &str) -> bool {
    arms(id).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_observer_is_applied_by_the_harness_with_arms_off_and_on() {
        assert_eq!(arms("observer"), Some(&["off", "on"][..]));
        assert!(applies("observer"));
        assert!(!applies("staging"));
    }
}
