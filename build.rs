// sqlx::migrate! embeds the migration files at compile time; without this
// a newly added migration would not trigger a rebuild.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
