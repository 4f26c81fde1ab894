use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::*;

const DEADLINE: Duration = Duration::from_secs(30);

/// What `read_request` makes of `sent`, the sender then closing its end.
fn read_sent(sent: &[u8]) -> Result<Request, RequestError> {
    let (mut client, mut server) = UnixStream::pair().unwrap();
    client.write_all(sent).unwrap();
    drop(client);
    read_request(&mut server, DEADLINE)
}

#[test]
fn a_request_is_its_method_and_path_without_the_query() {
    let got = read_sent(b"PUT /api/v1/vm.pause?now=1 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(
        got,
        Request {
            method: "PUT".into(),
            path: "/api/v1/vm.pause".into(),
            body: Vec::new(),
        }
    );
    let with_body = b"PUT /a HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
    let got = read_sent(with_body).unwrap();
    assert_eq!((got.path.as_str(), got.body.as_slice()), ("/a", &b"{}"[..]));
}

#[test]
fn bad_requests_get_their_status() {
    let status = |sent: &[u8]| read_sent(sent).unwrap_err().status();
    assert_eq!(status(b"\x00\x01garbage\r\n\r\n"), Some(400));
    assert_eq!(
        status(b"GET /a HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
        Some(400)
    );
    assert_eq!(
        status(b"GET /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
        Some(400)
    );
    let huge_body = format!("PUT /a HTTP/1.1\r\nContent-Length: {MAX_REQUEST}\r\n\r\n");
    assert_eq!(status(huge_body.as_bytes()), Some(413));
    let huge_head = format!("GET /a HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_REQUEST));
    assert_eq!(status(huge_head.as_bytes()), Some(413));
    let many = format!("GET /a HTTP/1.1\r\n{}\r\n", "X: 1\r\n".repeat(40));
    assert_eq!(status(many.as_bytes()), Some(400), "too many headers");
    // Half a request, then the client is gone: nobody to answer.
    assert_eq!(status(b"GET /api/v1/vm.in"), None);
    assert_eq!(status(b""), None);
}

#[test]
fn a_client_that_says_too_little_is_given_up_on_at_the_deadline() {
    let (mut client, mut server) = UnixStream::pair().unwrap();
    client
        .write_all(b"GET /api/v1/vm.info HTTP/1.1\r\n")
        .unwrap();
    let e = read_request(&mut server, Duration::from_millis(50)).unwrap_err();
    assert!(matches!(e, RequestError::TimedOut(_)), "{e}");
    assert_eq!(e.status(), Some(408));
}

#[test]
fn an_answer_is_http_with_a_json_body() {
    let bytes = Response::error(404, "no endpoint /x").to_bytes();
    let text = String::from_utf8(bytes).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 404 Not Found\r\n"), "{head}");
    assert!(head.contains(&format!("Content-Length: {}", body.len())));
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(json["error"], "no endpoint /x");
}
