//! Files whose mtime no HTTP date can say (before 1970, after 9999): the
//! response still comes, with `Last-Modified` clamped into range. (Common
//! filesystems cannot store mtimes past 2446, so the far future is covered
//! by `conditional`'s unit tests.)

use crate::support::*;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn set_mtime(path: &std::path::Path, t: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[tokio::test]
async fn out_of_range_mtimes_are_clamped_not_fatal() {
    // An object's Last-Modified is taken when it enters the object cache,
    // and this test rewrites mtimes under a live generation: the cache is
    // off here (cache.rs tests it).
    let fx = Fixture::new();
    let server = Server::with_config(oscontent_server::HttpConfig {
        cache_size: 0,
        ..Default::default()
    });
    server.publish(fx.publish(&fx.v1)).await;
    let object = fx.v1.object("filez");
    let cases: Vec<(SystemTime, &str)> = vec![
        (
            UNIX_EPOCH - Duration::from_secs(1),
            "Thu, 01 Jan 1970 00:00:00 GMT",
        ),
        (
            UNIX_EPOCH - Duration::from_secs(86_400 * 365 * 100),
            "Thu, 01 Jan 1970 00:00:00 GMT",
        ),
        (
            UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            "Tue, 14 Nov 2023 22:13:20 GMT",
        ),
    ];
    for (t, want) in cases {
        for path in ["/config", object.as_str()] {
            set_mtime(&fx.v1.dir.join(path.trim_start_matches('/')), t);
            let r = server.get(path).await;
            assert_eq!(r.status, 200, "{path} at {t:?}");
            assert_eq!(r.body, fx.v1.disk(path), "{path} at {t:?}");
            assert_eq!(r.header("last-modified"), Some(want), "{path} at {t:?}");
            // Conditionals against the clamped date still work.
            let again = server.get_with(path, &[("If-Modified-Since", want)]).await;
            assert_eq!(again.status, 304, "{path} at {t:?}");
        }
    }
}
