use std::io::Write;
use std::os::unix::net::UnixStream;

use super::*;

/// What [`Incoming`] makes of `sent`, the sender then closing its end.
fn read_sent(sent: &[u8]) -> Result<Request, RequestError> {
    let (mut client, server) = UnixStream::pair().unwrap();
    client.write_all(sent).unwrap();
    drop(client);
    Incoming::default()
        .receive(&server)
        .map(|r| r.expect("all sent"))
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
fn a_request_that_comes_in_pieces_is_read_as_they_come_without_waiting() {
    let (mut client, server) = UnixStream::pair().unwrap();
    let mut incoming = Incoming::default();
    assert!(incoming.receive(&server).unwrap().is_none(), "nothing yet");
    client
        .write_all(b"GET /api/v1/vm.info HTTP/1.1\r\n")
        .unwrap();
    assert!(incoming.receive(&server).unwrap().is_none(), "half of it");
    client.write_all(b"Host: x\r\n\r\n").unwrap();
    let request = incoming.receive(&server).unwrap().expect("all of it");
    assert_eq!(request.path, "/api/v1/vm.info");
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
