//! Stop strings matched in the frontend on the detokenized text. Text that
//! could still be the start of a stop string is held back until it is not,
//! unless the stop string stays in the output (`include_stop_str_in_output`).

/// Matches stop strings across streamed text pieces.
#[derive(Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    pending: String,
    /// Keep the matched stop string in the text (vLLM's `include_stop_str_in_output`).
    keep_stop: bool,
    /// With `keep_stop`: the end of the text already emitted, as long as the
    /// longest stop string less one byte, where a match may begin.
    emitted_tail: String,
}

impl StopStrings {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), ..Self::default() }
    }

    /// The same matcher, keeping a matched stop string in the text: nothing
    /// is held back, and the text ends right after the match.
    pub fn keeping_stop(mut self) -> Self {
        self.keep_stop = true;
        self
    }

    /// Adds `text`. Returns the text that is safe to emit and, when a stop
    /// string matched, that string (the text from it onwards is dropped, or
    /// after it when the stop string is kept). Of several matches, the one
    /// that ends first wins, ties going to the first listed, as in vLLM.
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        if self.stops.is_empty() {
            return (text.to_string(), None);
        }
        if self.keep_stop {
            return self.push_keeping_stop(text);
        }
        self.pending.push_str(text);
        let first_match = self
            .stops
            .iter()
            .filter_map(|stop| self.pending.find(stop.as_str()).map(|at| (at, stop)))
            .min_by_key(|&(at, stop)| at + stop.len());
        if let Some((at, stop)) = first_match {
            let stop = stop.clone();
            self.pending.truncate(at);
            return (std::mem::take(&mut self.pending), Some(stop));
        }
        let held = self.held_back_len();
        let emit = self.pending[..self.pending.len() - held].to_string();
        self.pending.drain(..self.pending.len() - held);
        (emit, None)
    }

    /// `push` when the stop string is kept: everything up to the end of the
    /// first match goes out at once, matches may begin in text already sent.
    fn push_keeping_stop(&mut self, text: &str) -> (String, Option<String>) {
        let tail_len = self.emitted_tail.len();
        let mut window = std::mem::take(&mut self.emitted_tail);
        window.push_str(text);
        let first_match = self
            .stops
            .iter()
            .filter_map(|stop| window.find(stop.as_str()).map(|at| (at + stop.len(), stop)))
            .min_by_key(|&(end, _)| end);
        if let Some((end, stop)) = first_match {
            // A match wholly inside the tail was found before: `end` lies in `text`.
            return (text[..end.saturating_sub(tail_len)].to_string(), Some(stop.clone()));
        }
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut start = window.len().saturating_sub(longest.saturating_sub(1));
        while !window.is_char_boundary(start) {
            start += 1;
        }
        self.emitted_tail = window[start..].to_string();
        (text.to_string(), None)
    }

    /// Everything still held back (the stream ended without a match).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length in bytes of the longest suffix of the pending text that is a
    /// proper prefix of some stop string.
    fn held_back_len(&self) -> usize {
        self.stops
            .iter()
            .flat_map(|stop| stop.char_indices().skip(1).map(move |(end, _)| &stop[..end]))
            .filter(|prefix| self.pending.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_stops_passes_text_through() {
        let mut s = StopStrings::new(vec![]);
        assert_eq!(s.push("abc"), ("abc".into(), None));
    }

    #[test]
    fn match_inside_one_piece_truncates() {
        let mut s = StopStrings::new(vec!["STOP".into()]);
        assert_eq!(s.push("hello STOP world"), ("hello ".into(), Some("STOP".into())));
    }

    #[test]
    fn match_across_pieces_is_held_back_then_found() {
        let mut s = StopStrings::new(vec!["STOP".into()]);
        assert_eq!(s.push("hello ST"), ("hello ".into(), None));
        assert_eq!(s.push("O"), ("".into(), None));
        assert_eq!(s.push("P!"), ("".into(), Some("STOP".into())));
    }

    #[test]
    fn false_start_is_released() {
        let mut s = StopStrings::new(vec!["STOP".into()]);
        assert_eq!(s.push("ST"), ("".into(), None));
        assert_eq!(s.push("AR"), ("STAR".into(), None));
        assert_eq!(s.push("S"), ("".into(), None));
        assert_eq!(s.flush(), "S");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut s = StopStrings::new(vec!["world".into(), "lo".into()]);
        assert_eq!(s.push("hello world"), ("hel".into(), Some("lo".into())));
    }

    #[test]
    fn the_stop_string_that_ends_first_wins() {
        let mut s = StopStrings::new(vec!["abc".into(), "b".into()]);
        assert_eq!(s.push("xabc"), ("xa".into(), Some("b".into())));
    }

    #[test]
    fn a_kept_stop_string_ends_the_text_and_nothing_is_held_back() {
        let mut s = StopStrings::new(vec!["STOP".into()]).keeping_stop();
        assert_eq!(s.push("hello ST"), ("hello ST".into(), None));
        assert_eq!(s.push("OP and more"), ("OP".into(), Some("STOP".into())));
        let mut s = StopStrings::new(vec!["lo".into()]).keeping_stop();
        assert_eq!(s.push("hello world"), ("hello".into(), Some("lo".into())));
    }

    #[test]
    fn multibyte_prefixes_respect_char_boundaries() {
        let mut s = StopStrings::new(vec!["é!".into()]);
        assert_eq!(s.push("café"), ("caf".into(), None));
        assert_eq!(s.push("?"), ("é?".into(), None));
    }
}
