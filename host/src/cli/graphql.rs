//! `orl graphql`: the GraphQL schema, for client code generators and dashboards.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum GraphqlCommand {
    /// Print the schema in the GraphQL schema definition language.
    Schema,
}

pub fn run(command: GraphqlCommand) -> anyhow::Result<()> {
    match command {
        GraphqlCommand::Schema => print!("{}", crate::graphql::sdl()),
    }
    Ok(())
}
