//! Globs for model names and the like: `*` any run of characters, `?` one character.

/// `*` matches any run of characters, `?` one character; everything else matches itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was, and the text position it currently stands for.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_stars_and_single_characters() {
        assert!(glob_match("gpt-5*", "gpt-5.5"));
        assert!(glob_match("gpt-5*", "gpt-5"));
        assert!(!glob_match("gpt-5*", "gpt-4o"));
        assert!(glob_match("*mini", "gpt-5.5-mini"));
        assert!(glob_match("gpt-?.5", "gpt-5.5"));
        assert!(!glob_match("gpt-?.5", "gpt-10.5"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "a-x-b-y-c"));
        assert!(!glob_match("a*b*c", "a-x-c-y-b"));
        assert!(glob_match("gpt-5.5", "gpt-5.5"));
        assert!(!glob_match("gpt-5.5", "gpt-5.5-codex"));
    }
}
