//! Lowercase hex, the one way ids and digests are spelled in headers, logs, keys and audit rows.

/// `bytes` as lowercase hex, two digits a byte, in one allocation.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lowercase_digits_a_byte() {
        assert_eq!(super::hex(&[]), "");
        assert_eq!(super::hex(&[0x00, 0x0f, 0xa0, 0xff, 0x5c]), "000fa0ff5c");
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(super::hex(&all), all.iter().map(|b| format!("{b:02x}")).collect::<String>());
    }
}
