//! Numbers as text without `core::fmt`: the server writes some on every
//! request (paths, ETags, the access log), where the formatter's
//! machinery cost more than the rest of the line.

/// `n` in decimal, written into the end of `buf`.
pub fn decimal(buf: &mut [u8; 20], n: u64) -> &str {
    digits(buf, n, 10)
}

/// `n` in lowercase hex, as `{:x}` writes it, written into the end of
/// `buf`.
pub fn hex(buf: &mut [u8; 20], n: u64) -> &str {
    digits(buf, n, 16)
}

fn digits(buf: &mut [u8; 20], mut n: u64, base: u64) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b"0123456789abcdef"[(n % base) as usize];
        n /= base;
        if n == 0 {
            break;
        }
    }
    // Digits are ASCII.
    std::str::from_utf8(&buf[at..]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_what_the_formatter_writes() {
        for n in [
            0,
            1,
            9,
            10,
            15,
            16,
            99,
            100,
            0xabc,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = [0u8; 20];
            assert_eq!(decimal(&mut buf, n), n.to_string());
            assert_eq!(hex(&mut buf, n), format!("{n:x}"));
        }
    }
}
