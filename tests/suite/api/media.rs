use crate::api::helpers::*;

fn media_files(app: &TestApp) -> Vec<String> {
    std::fs::read_dir(app.data_dir.path().join("media"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[actix_rt::test]
async fn a_png_is_stored_under_its_sha256_once() {
    let app = spawn_app().await;
    let png = tiny_png();
    let first = app.upload_png().await;
    let id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 64);
    assert_eq!(first["mime"], "image/png");
    assert_eq!(first["size"], png.len());
    assert_eq!(first["filename"], "dot.png");
    app.assert_schema("Media", &first).await;
    assert_eq!(
        std::fs::read(app.data_dir.path().join("media").join(&id)).unwrap(),
        png
    );

    // The same bytes again (no Content-Type, no name): the first record.
    let again = app
        .send("POST", "/v1/media", None, Some(png.clone()), &[])
        .await;
    assert_eq!(again.status, 201, "{}", again.text);
    assert_eq!(again.json, first);
    assert_eq!(media_files(&app), vec![id.clone()]);

    let got = app.get(&format!("/v1/media/{id}")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json, first);
}

#[actix_rt::test]
async fn only_images_within_the_limit_are_accepted() {
    let app = spawn_app().await;
    let pdf = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n".to_vec();
    let r = app
        .send("POST", "/v1/media", Some("image/png"), Some(pdf), &[])
        .await;
    assert_problem(&r, 415, None);
    assert!(r.json["detail"]
        .as_str()
        .unwrap()
        .contains("application/pdf"));

    let r = app
        .send(
            "POST",
            "/v1/media",
            None,
            Some(b"just some text".to_vec()),
            &[],
        )
        .await;
    assert_problem(&r, 415, None);

    let r = app
        .send("POST", "/v1/media", None, Some(Vec::new()), &[])
        .await;
    assert_problem(&r, 422, Some("body"));

    // A PNG header followed by padding past media.max_bytes.
    let mut big = tiny_png();
    big.resize(MEDIA_LIMIT + 1, 0);
    let r = app.send("POST", "/v1/media", None, Some(big), &[]).await;
    assert_problem(&r, 413, None);

    let r = app
        .send(
            "POST",
            "/v1/media?filename=../../etc/passwd",
            None,
            Some(tiny_png()),
            &[],
        )
        .await;
    assert_problem(&r, 400, Some("filename"));
    let r = app
        .send("POST", "/v1/media?name=x.png", None, Some(tiny_png()), &[])
        .await;
    assert_problem(&r, 400, Some("name"));

    // Nothing was written, on disk or in the database.
    assert!(media_files(&app).is_empty(), "{:?}", media_files(&app));
}

#[actix_rt::test]
async fn unknown_media_is_404() {
    let app = spawn_app().await;
    assert_problem(
        &app.get(&format!("/v1/media/{}", "0".repeat(64))).await,
        404,
        None,
    );
    assert_problem(&app.get("/v1/media/not-a-hash").await, 404, None);
}
